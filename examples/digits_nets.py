"""Stage builders for the digits data set: a convolutional encoder feeding a classifier.

    PYTHONPATH=examples python -m chain mode=e2e \
        '+stages=[{model: {_target_: digits_nets.encoder, filters: 16}},{model: {_target_: digits_nets.classifier}}]'

Each builder is called on its stage's device as `builder(input_shape=..., **kwargs)` and
returns Keras layers; the chain connects them, trains them, checkpoints and exports them.
"""

import keras


def encoder(input_shape, filters=16):
    """8x8x1 digit images -> a 64-wide feature vector (the first stage)."""
    return [
        keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
    ]


def classifier(input_shape, classes=10):
    """Features -> logits of the ten digits (the last stage: in mode=e2e it outputs the prediction)."""
    x = keras.Input(input_shape)
    h = keras.layers.Dense(64, activation="relu")(x)
    h = keras.layers.Add()([x, h])  # a skip connection inside the stage
    return keras.Model(x, keras.layers.Dense(classes)(h), name="classifier")
