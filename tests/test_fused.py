"""optim.fused: TensorFlow's fused update kernels in place of Keras' op-per-term update.

Both are the default. SGD's fused update is Keras' arithmetic in Keras' order, bit for bit;
Adam's is not (its kernel rounds 1 - beta in float32), so it is held to Keras' Adam within
float32 rounding, and a chain trained with it to the same chain trained with Keras' Adam
(`optim.fused=false`, one setting away). The equality tests elsewhere compare a chain with one
device through the same kernel: pipelining must not change the math, whichever update it is."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.stages.fused import FusedAdam, FusedSGD

SHAPES = [(12, 8), (8,), (8, 3)]
STEPS = 12


def _trained(cls, dtype="float32", jit=False, **kwargs) -> list[np.ndarray]:
    """Variables, slots and iteration count after STEPS updates from fixed gradients of every
    scale from 1e-6 to 1e2 (a clipnorm in `kwargs` then clips some and not others)."""
    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.standard_normal(s).astype("float32")) for s in SHAPES]
    grads = [
        [tf.constant(rng.standard_normal(s) * 10.0 ** rng.integers(-6, 3), dtype) for s in SHAPES] for _ in range(STEPS)
    ]
    opt = cls(**kwargs)
    opt.build(variables)

    @tf.function(jit_compile=jit, autograph=False)
    def apply(gs):
        opt.apply(gs, variables)

    for gs in grads:
        apply(gs)
    return [v.numpy() for v in variables + list(opt.variables)]


SGD_CASES = {
    "plain": {},
    "momentum": {"momentum": 0.9},
    "nesterov": {"momentum": 0.9, "nesterov": True},
    "clipnorm": {"momentum": 0.5, "clipnorm": 1.0},
}


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_fused_sgd_is_keras_sgd_bit_for_bit(case):
    kwargs = {"learning_rate": 0.05, **SGD_CASES[case]}
    keras_state, fused_state = _trained(keras.optimizers.SGD, **kwargs), _trained(FusedSGD, **kwargs)
    assert len(keras_state) == len(fused_state)
    for a, b in zip(keras_state, fused_state):
        np.testing.assert_array_equal(a, b)


def test_fused_sgd_from_float16_gradients_and_under_xla_is_keras_sgd_bit_for_bit():
    for options in ({"dtype": "float16"}, {"jit": True}):
        kwargs = {"learning_rate": 0.05, "momentum": 0.9}
        for a, b in zip(_trained(keras.optimizers.SGD, **options, **kwargs), _trained(FusedSGD, **options, **kwargs)):
            np.testing.assert_array_equal(a, b)


def test_fused_adam_is_keras_adam_within_float32_rounding():
    lr = 1e-3
    kwargs = {"learning_rate": lr, "clipnorm": 1.0}
    keras_state, fused_state = _trained(keras.optimizers.Adam, **kwargs), _trained(FusedAdam, **kwargs)
    different = 0
    for a, b in zip(keras_state, fused_state):
        # The moments differ by about 1.3e-5 of themselves (1 - 0.999f against 0.001f), so a weight
        # by that share of how far it moved (at most lr a step), not of its value.
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5 * lr * STEPS)
        different += int(np.sum(a != b))
    # Not the same bits (1 - beta rounds differently): why optim.fused=false is kept, for Keras' Adam exactly.
    assert different > 0


def test_a_chain_trained_with_fused_adam_matches_keras_adam_and_both_are_fused_by_default():
    base = [
        "+stages=2",
        "mode=e2e",
        "model.depth=1",
        "model.width=16",
        "data=synthetic",
        "data.features=6",
        "data.classes=4",
        "data.samples=128",
        "data.batch_size=16",
        "trainer.progress=false",
        "pipeline.microbatches=2",
    ]
    runs = {f: chain.build(chain.compose(base + [f"optim.fused={f}".lower()])) for f in (False, True)}
    assert all(isinstance(s.optimizer, FusedAdam) for s in runs[True].stages)
    assert not any(isinstance(s.optimizer, FusedAdam) for s in runs[False].stages)
    it = iter(runs[False].batches())
    for _ in range(5):
        x, ys = next(it)
        losses = [r.step(x, ys)["loss"] for r in runs.values()]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for a, b in zip(*[[v.numpy() for s in r.stages for v in s.trainable_variables] for r in runs.values()]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    for optim, fused in (("adam", FusedAdam), ("sgd", FusedSGD)):
        default = chain.build(chain.compose(base + [f"optim={optim}"]))
        assert all(isinstance(s.optimizer, fused) for s in default.stages)
