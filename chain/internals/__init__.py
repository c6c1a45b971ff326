"""TensorFlow's, Keras' and Hydra's private parts, each behind a named function: one module per
library (`tf_private`, `keras_private`, `hydra_private`), so that an upgrade that changes one of
them breaks here, by name (`tests/test_internals.py` exercises every wrapper against the
installed versions), and no other module of chain reaches a private name of those libraries
(`tests/test_structure.py`). Each module imports its library only inside its functions."""
