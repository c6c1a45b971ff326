"""A model with named inputs (keras_hub's `{"token_ids", "padding_mask"}`, BERT's `segment_ids` too) fed
from a config's data set, which gives one array per example: the token ids.

The config's sources give windows of ids (`data=tokens`, `data=text`) or any one array, every position
real: a keras_hub model takes them as its `token_ids`, a `padding_mask` of ones (no padding in a full
window) and `segment_ids` of zeros (one segment), each in its `Input`'s dtype. A model naming any other
input cannot be fed from one array: `refusal` says so in one line, naming the keys. Batches given as a
dict (`run.step(x, y)` with `x` a dict of arrays) are the user's own and pass as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from chain.errors import ConfigError

TOKEN_IDS = "token_ids"
FILLED = {"padding_mask": 1, "segment_ids": 0}  # the inputs made for a full window, and the value of each


def named(model: Any) -> dict | None:
    """`model`'s named inputs (its `Input` tensors by name), or None when it takes one tensor or a list."""
    try:
        inputs = model.input
    except AttributeError:  # a model never called (a Sequential built from its layers' shapes, a subclass): one tensor
        return None
    return inputs if isinstance(inputs, dict) else None


def feeder(model: Any) -> Callable[[Any], Any] | None:
    """The function making `model`'s named inputs from one batch of token ids, or None when `model` takes
    one tensor (or a list) itself. Raises the `refusal` ConfigError for named inputs it cannot make."""
    inputs = named(model)
    if inputs is None:
        return None
    problem = refusal(sorted(inputs))
    if problem is not None:
        raise ConfigError(problem)
    dtypes = {key: inputs[key].dtype for key in inputs}

    def make(x):
        import tensorflow as tf

        if isinstance(x, dict):  # the data's own named inputs (packed windows: token and segment ids)
            return x

        x = tf.convert_to_tensor(x)
        out = {TOKEN_IDS: tf.cast(x, dtypes[TOKEN_IDS])}
        for key in dtypes.keys() & FILLED.keys():
            out[key] = tf.fill(tf.shape(x), tf.constant(FILLED[key], dtypes[key]))
        return out

    return make


def refusal(keys: list[str]) -> str | None:
    """The one line refusing a model with named inputs `keys` fed from one array, or None if it can be."""
    unknown = [k for k in keys if k != TOKEN_IDS and k not in FILLED]
    if TOKEN_IDS in keys and not unknown:
        return None
    return (
        f"the model takes named inputs {keys}, but the config's data set gives one array per example: it feeds "
        f"'{TOKEN_IDS}' (with {' and '.join(repr(k) for k in FILLED)} made for full windows: ones, zeros) and "
        f"no other input ({', '.join(repr(k) for k in unknown) or repr(TOKEN_IDS) + ' is missing'}); "
        "train it from Python, run.step(x, y) with x a dict of arrays"
    )


PACKED = (TOKEN_IDS, "segment_ids")  # what packed windows (`data.pack`) give a model, by name


def check_packed(model: Any, name: str) -> None:
    """`data.pack=true`: the model must take `PACKED` as its named inputs (its attention masked by the
    segment ids, its positions restarting with them: docs/language-models.md); one line naming what it
    takes otherwise, before anything is built."""
    inputs = named(model)
    if inputs is not None and sorted(inputs) == sorted(PACKED):
        return
    takes = "one tensor" if inputs is None else "named inputs " + ", ".join(sorted(inputs))
    raise ConfigError(
        f"data.pack=true gives the model windows of several examples as {{'token_ids', 'segment_ids'}}, but {name} "
        f"takes {takes}: declare its inputs as a dict of keras.Input(name='token_ids') and "
        "keras.Input(name='segment_ids') and mask its attention by the segment ids (docs/language-models.md), or "
        "set data.pack=false"
    )
