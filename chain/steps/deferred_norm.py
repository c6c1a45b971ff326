"""`pipeline.batch_norm=deferred`: BatchNormalization's moving statistics updated once per step
from the whole batch, as Keras' layer updates them when called on the whole batch of the inputs
it saw (torchgpipe's deferred batch norm).

In a pipeline every microbatch goes through a stage's `BatchNormalization` layers on its own:
by default (`microbatch`) each microbatch is normalized with its own statistics and the
moving mean and variance are updated once per microbatch, M times a step, each time from B/M
examples. Deferred keeps the first (each microbatch is still normalized with its own
statistics: the forward needs no statistics of microbatches that have not arrived yet) and
replaces the second: while the step is traced, each layer's momentum is 1 (the per-microbatch
update keeps the moving statistics as they are) and the mean and variance it computes for
each microbatch are recorded; after the stage's last backward, the whole batch's mean and
(biased, as Keras') variance are formed from them, the microbatches being equal,

    mean = avg_m mean_m,    variance = avg_m variance_m + avg_m (mean_m - mean)^2,

and the moving statistics take one update with the layer's momentum, on the stage's device:
what `BatchNormalization` does on the whole batch at once. The recorded moments are tensors
of the stage's forward, so the step must trace the forward inline (not under
`trainer.jit_compile`, checked in the config). Layers that are frozen (`trainable=False`) or
in inference mode record nothing and keep their moving statistics, as in Keras. Renorm is
refused when the step is built, masked inputs when it is traced (their statistics are not the
plain moments).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import keras
import tensorflow as tf

from chain.errors import ConfigError
from chain.internals.keras_private import all_layers, own_moments, patch_moments, unpatch_moments
from chain.stages.stage import Stage
from chain.steps.ops import copy_to


def norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer of `model`, nested models included."""
    return [layer for layer in all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


class Deferred:
    """The deferred statistics of a chain's stages for one traced step: `recording()` around the
    trace of the microbatches' forwards, `update(stage)` once after that stage's last backward."""

    def __init__(self, stages: Sequence[Stage]):
        self.layers = {s.index: norm_layers(s.model) for s in stages}
        for layer in (layer for ls in self.layers.values() for layer in ls):
            if layer.renorm:
                raise ConfigError(
                    f"pipeline.batch_norm=deferred: layer {layer.name!r} uses batch renormalization, "
                    "whose statistics are not the batch's moments; use pipeline.batch_norm=microbatch"
                )
        self.moments: dict[int, list[tuple[tf.Tensor, tf.Tensor]]] = {}  # id(layer) -> one (mean, var) per call
        self.momentum: dict[int, float] = {}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """While the step is traced: momentum 1 and every layer's moments recorded (restored after)."""
        self.moments = {}
        layers = [layer for ls in self.layers.values() for layer in ls]
        for layer in layers:
            self.momentum[id(layer)] = layer.momentum
            layer.momentum = 1.0
            patch_moments(layer, self._recorder(layer))  # Keras' hook for the batch's moments
        try:
            yield
        finally:
            for layer in layers:
                layer.momentum = self.momentum[id(layer)]
                unpatch_moments(layer)

    def _recorder(self, layer: keras.layers.BatchNormalization):
        own = own_moments(layer)

        def moments(inputs, mask):
            if mask is not None:
                raise ConfigError(
                    f"pipeline.batch_norm=deferred: layer {layer.name!r} gets a mask; deferred "
                    "statistics take unmasked inputs: use pipeline.batch_norm=microbatch"
                )
            mean, variance = own(inputs, mask)
            self.moments.setdefault(id(layer), []).append((mean, variance))
            return mean, variance

        return moments

    def update(self, stage: Stage) -> None:
        """The one update of `stage`'s moving statistics from its microbatches' moments (call in the
        stage's device scope, after its last backward)."""
        for layer in self.layers[stage.index]:
            self._update(layer, self.moments.get(id(layer)))

    def _update(self, layer: keras.layers.BatchNormalization, found: list[tuple[tf.Tensor, tf.Tensor]] | None) -> None:
        """`layer`'s one update from the moments of equal microbatches `found` (None or empty: none)."""
        if found:
            means = tf.stack([tf.stop_gradient(m) for m, _ in found])
            variances = tf.stack([tf.stop_gradient(v) for _, v in found])
            mean = tf.reduce_mean(means, axis=0)
            variance = tf.reduce_mean(variances, axis=0) + tf.reduce_mean(tf.square(means - mean), axis=0)
            momentum = self.momentum[id(layer)]
            moving_mean = tf.cast(layer.moving_mean, mean.dtype)
            moving_variance = tf.cast(layer.moving_variance, variance.dtype)
            layer.moving_mean.assign(moving_mean * momentum + mean * (1.0 - momentum))
            layer.moving_variance.assign(moving_variance * momentum + variance * (1.0 - momentum))


class Pooled:
    """Copy `replica`'s deferred statistics among copies of a pipeline (`placement.replicas`): each
    copy records its own microbatches (`group[r]`, one `Deferred` per copy), and stage k's update of
    every copy takes the moments of every copy's microbatches, copied onto its device in replica
    order: the statistics of the whole global batch (its R x M microbatches are equal), the same
    bits on every copy, as one `Deferred` over the whole batch computes them on one device."""

    def __init__(self, group: Sequence[Deferred], replica: int):
        self.group, self.replica = list(group), replica

    def update(self, stage: Stage) -> None:
        """`Deferred.update` for this copy's `stage`, from every copy's moments (in the stage's device scope)."""
        k, mine = stage.index, self.group[self.replica]
        for i, layer in enumerate(mine.layers[k]):
            pooled = []
            for q, d in enumerate(self.group):
                found = d.moments.get(id(d.layers[k][i])) or []
                if q == self.replica:
                    pooled += found
                    continue
                for j, (mean, variance) in enumerate(found):  # a few channels' moments: small copies
                    name = f"moments_s{k}_l{i}_m{j}_from_r{q}_to_r{self.replica}"
                    pooled.append(
                        (
                            copy_to(mean, stage.device, f"mean_{name}"),
                            copy_to(variance, stage.device, f"variance_{name}"),
                        )
                    )
            mine._update(layer, pooled)
