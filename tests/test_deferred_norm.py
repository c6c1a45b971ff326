"""pipeline.batch_norm=deferred: a ResNet-style model with BatchNormalization, cut into stages and
trained with 4 microbatches, updates its moving statistics once per step as Keras' own layer does
on the whole batch (for the first BN layer: exactly full-batch training's); the default (each
microbatch updates them) is shown not to."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import rel_diff

L = keras.layers
M = 4
RUN = [
    "mode=e2e",
    "+stages=2",
    "placement.split=[3,9]",
    "data=digits",
    "data.batch_size=16",
    "pipeline.schedule=1f1b",
    f"pipeline.microbatches={M}",
    "optim=sgd",
    "optim.lr=0.1",
    "trainer.progress=false",
    "checkpoint.export=false",
]


def resnet_style() -> keras.Model:
    """Conv-BN-ReLU, a residual block of two Conv-BN with a skip, pooling and a read-out (12 layers;
    cut [3, 9]: the stem, then the block and the head)."""
    keras.utils.set_random_seed(3)
    x = keras.Input((8, 8, 1))
    h = L.ReLU()(L.BatchNormalization(momentum=0.9)(L.Conv2D(8, 3, padding="same")(x)))
    b = L.BatchNormalization(momentum=0.9)(L.Conv2D(8, 3, padding="same")(h))
    b = L.BatchNormalization(momentum=0.9)(L.Conv2D(8, 3, padding="same")(L.ReLU()(b)))
    h = L.ReLU()(L.Add()([h, b]))
    return keras.Model(x, L.Dense(10)(L.GlobalAveragePooling2D()(h)), name="resnetish")


def norms(layers) -> list:
    return [layer for layer in layers if isinstance(layer, L.BatchNormalization)]


def whole_batch_statistics(model: keras.Model, x) -> list[tuple[np.ndarray, np.ndarray]]:
    """Keras' own BatchNormalization, called once in training mode on the whole batch of the inputs each
    of `model`'s BN layers sees when the batch goes through in M microbatches (each normalized by the
    layers before with its own statistics): its moving mean and variance after that one update. For
    the first BN layer, whose input no other BN layer touches, that is full-batch training's."""
    out = []
    for layer in norms(model.layers):
        features = keras.Model(model.input, layer.input)
        seen = np.concatenate([features(part, training=True) for part in np.split(x, M)])
        fresh = type(layer).from_config(layer.get_config())
        fresh.build(seen.shape)
        fresh.set_weights(layer.get_weights())
        fresh(seen, training=True)
        out.append((fresh.moving_mean.numpy(), fresh.moving_variance.numpy()))
    return out


def one_step(batch_norm: str, *overrides: str, keep=None) -> tuple[list, list]:
    """(the chain's moving statistics after one step of M microbatches, `whole_batch_statistics`);
    `overrides` replace RUN's keys they set; `keep`: a list the run is appended to."""
    model = resnet_style()
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    given = {o.split("=", 1)[0] for o in overrides}
    cfg = [o for o in RUN if o.split("=", 1)[0] not in given] + list(overrides)
    run = chain.build(chain.compose(cfg + [f"pipeline.batch_norm={batch_norm}"]), model=model)
    if keep is not None:
        keep.append(run)
    x, ys = next(iter(run.batches()))
    want = whole_batch_statistics(reference, x.numpy())
    run.step(x, ys)
    got = [
        (layer.moving_mean.numpy(), layer.moving_variance.numpy())
        for layer in norms([layer for s in run.stages for layer in s.model.layers])
    ]
    return got, want


def test_deferred_moving_statistics_are_one_update_from_the_whole_batch_and_the_default_is_not():
    start = [(layer.moving_mean.numpy(), layer.moving_variance.numpy()) for layer in norms(resnet_style().layers)]
    got, want = one_step("deferred")
    assert len(got) == len(want) == 3
    for g, w, w0 in zip(got, want, start):
        for a, b, b0 in zip(g, w, w0):
            assert rel_diff(a, b) <= 1e-5
            assert rel_diff(b, b0) > 1e-2  # the statistics moved: equality is not trivial
    got, want = one_step("microbatch")  # the default: M updates a step, each from B/M examples
    for g, w in zip(got, want):
        assert max(rel_diff(a, b) for a, b in zip(g, w)) > 1e-2


def test_deferred_batch_norm_with_xla_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"^pipeline.batch_norm=deferred records each microbatch's statistics "
        r"[^\n]*set one of them$",
    ):
        chain.compose(RUN + ["pipeline.batch_norm=deferred", "trainer.jit_compile=true"])


def test_copies_of_the_pipeline_update_their_statistics_from_the_whole_global_batch():
    """placement.replicas=2, 2 microbatches per copy: each copy's one update takes the moments of all
    4 microbatches (both copies'), as one device's layer on the whole batch; both copies stay equal."""
    start = [(layer.moving_mean.numpy(), layer.moving_variance.numpy()) for layer in norms(resnet_style().layers)]
    runs = []
    got, want = one_step("deferred", "placement.replicas=2", f"pipeline.microbatches={M // 2}", keep=runs)
    assert len(got) == len(want) == 3
    for g, w, w0 in zip(got, want, start):
        for a, b, b0 in zip(g, w, w0):
            assert rel_diff(a, b) <= 1e-5
            assert rel_diff(b, b0) > 1e-2
    first, second = ([v.numpy() for s in copy for v in s.model.variables] for copy in runs[0].strategy.copies)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
