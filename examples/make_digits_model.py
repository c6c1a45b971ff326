"""Write `digits_model.keras`: one functional Keras model for the digits data set, to cut into stages.

    python examples/make_digits_model.py examples/digits_model.keras
    python -m chain model=keras model.path=examples/digits_model.keras +stages=3 mode=e2e placement.balance=params

It is an ordinary model (eight layers, a residual block in the middle, logits out); the chain
cuts it where one tensor crosses, builds each piece on its stage's device with the same
weights, and trains it as a pipeline.
"""

import sys

from chain.cli import import_tensorflow_quietly

import_tensorflow_quietly()  # as chain's commands do: without TensorFlow's start-up banner
import keras  # noqa: E402


def digits_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_a")(x)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_b")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(128, activation="relu", name="dense_a")(h)
    r = keras.layers.Dense(128, activation="relu", name="dense_b")(h)
    h = keras.layers.Add(name="residual")([h, r])
    h = keras.layers.Dense(64, activation="relu", name="dense_c")(h)
    return keras.Model(x, keras.layers.Dense(10, name="logits")(h), name="digits_model")


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "digits_model.keras"
    digits_model().save(path)
    print(f"wrote {path}")
