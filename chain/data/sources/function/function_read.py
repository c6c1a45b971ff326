"""The user's function returning a `tf.data.Dataset` (`data=callable`): resolved and checked by
`chain.targets`, called through Hydra's `instantiate`, its elements checked (`function_dataset`), and
read whole into NumPy once, at build time (`call`; bounded by `data.max_examples` and
`data.read_timeout_s`)."""

from __future__ import annotations

import tensorflow as tf

from chain import targets
from chain.data.tensors import gather
from chain.errors import ConfigError, instantiate_error


def _call(data) -> tf.data.Dataset:
    """Call the user's function through Hydra's `instantiate` (its checks on targets included), once it is
    resolved and checked to be callable (`chain.targets.function`)."""
    from hydra.utils import instantiate

    what = f"data._target_={data._target_}"
    targets.function("data._target_", data._target_, targets.DATA_FUNCTION_RETURNS)
    try:
        result = instantiate({"_target_": data._target_, **data.kwargs})
    except Exception as e:  # noqa: BLE001 (the user's function may raise anything; Hydra wraps it)
        raise instantiate_error(e, what) from None
    if not isinstance(result, tf.data.Dataset):
        raise ConfigError(f"{what} returned {type(result).__name__}; it must return {targets.DATA_FUNCTION_RETURNS}")
    if result.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(
            f"{what} returned an endless dataset (it repeats); return each example once: chain repeats and shuffles it"
        )
    return result


def function_dataset(data) -> tf.data.Dataset:
    """The user's function's dataset (`data=callable`), its elements checked to be single examples
    `(x, y)` or `(x, {name: y})` of fixed shapes; not read."""
    dataset = _call(data)
    what = f"data._target_={data._target_}"
    spec = dataset.element_spec
    ys = spec[1] if isinstance(spec, tuple) and len(spec) == 2 else None
    ys = list(ys.values()) if isinstance(ys, dict) else [ys]
    if not (
        isinstance(spec, tuple)
        and isinstance(spec[0], tf.TensorSpec)
        and ys
        and all(isinstance(y, tf.TensorSpec) for y in ys)
    ):
        raise ConfigError(
            f"{what} returned a dataset of {spec}; its elements must be (x, y) or (x, {{name: y}}), one example each"
        )
    if not all(s.shape.is_fully_defined() for s in [spec[0], *ys]):
        raise ConfigError(
            f"{what} returned examples of unknown shape ({spec}); every x and every y must have "
            "one fixed shape (do not batch the dataset: chain does)"
        )
    return dataset


def call(data) -> tuple:
    """The fields of a `chain.data.data_source.Read` of the user's function (`data=callable`): its
    inputs, targets, their names (None: a bare y, named by its kind) and where each came from."""
    dataset = function_dataset(data)
    what = f"data._target_={data._target_}"
    x, y = gather(dataset, what, data.max_examples, data.read_timeout_s)
    if isinstance(y, dict):
        names = list(y)
        return x, [y[n] for n in names], names, [f"{what} x"] + [f"{what} y[{n!r}]" for n in names]
    return x, [y], [None], [f"{what} x", f"{what} y"]
