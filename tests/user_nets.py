"""Stage builders as a user would write them (imported by tests, and by CLI tests via PYTHONPATH)."""

import keras


def encoder(input_shape, units=16):
    """A small encoder: one hidden layer."""
    return [keras.layers.Flatten(), keras.layers.Dense(units, activation="relu", name="enc")]


def head(input_shape, classes=4):
    """A classifier head producing logits."""
    return keras.layers.Dense(classes, name="logits")


def block(input_shape, units=8):
    """A functional block with a skip connection inside: a keras.Model built for its input."""
    x = keras.Input(input_shape)
    h = keras.layers.Dense(units, activation="tanh")(keras.layers.Flatten()(x))
    out = keras.layers.Concatenate()([h, keras.layers.Dense(units)(h)])
    return keras.Model(x, out)


def broken(input_shape):
    raise RuntimeError("the builder failed on purpose")


def writes_a_file(file, **kwargs):
    """Code a config names that must not run where it does not belong (an optimizer's `_target_`):
    calling it writes `file`."""
    with open(file, "w") as f:
        f.write("called")


def not_a_layer(input_shape):
    return "a string"


def conv_only(input_shape):
    """Needs image input: a flat input does not fit."""
    return keras.layers.Conv2D(4, 3)


def regularized(input_shape, units=8, l2=0.05):
    """A hidden layer with an L2 kernel regularizer (Keras adds it to the loss `fit` minimizes)."""
    return keras.layers.Dense(units, activation="tanh", kernel_regularizer=keras.regularizers.L2(l2), name="reg")


class MeanSquare(keras.layers.Layer):
    """Passes its input through and adds `weight x mean(x^2)` to the loss (`add_loss`)."""

    def __init__(self, weight=0.1, **kwargs):
        super().__init__(**kwargs)
        self.weight = weight

    def call(self, x):
        self.add_loss(self.weight * keras.ops.mean(keras.ops.square(x)))
        return x

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}


def with_added_loss(input_shape, units=8):
    """A hidden layer whose activations add a term of their own to the loss (`add_loss`)."""
    return [keras.layers.Dense(units, activation="tanh", name="dense"), MeanSquare(name="mean_square")]
