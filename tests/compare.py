"""Comparing two trainings of the same chain.

One metric for equal computations: `rel_diff`, per variable, the largest elementwise
difference over the largest magnitude. Low-precision training is compared with float32 in
norm instead (`norm_rel_diff` over each stage's weights as one vector): each weight is
rounded independently at the low precision's resolution, so single elements deviate by a
unit roundoff where the stage as a whole does not (bfloat16, measured: up to 9.6e-3
elementwise against 2.9e-3 in norm, 2u = 7.8e-3).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import keras
import numpy as np
import tensorflow as tf


def weights(run) -> list[np.ndarray]:
    """Every trainable variable of every stage, in order."""
    return [v.numpy() for s in run.stages for v in s.trainable_variables]


def assert_values_alike(a: dict, b: dict, rtol: float = 0.0) -> None:
    """Two checkpoints' variables (`key -> array`, e.g. conftest's `stage_values`): the same keys, floating
    values within `rtol` (`rel_diff`), the rest equal; `rtol=0`: every value equal."""
    assert a.keys() == b.keys()
    for key in a:
        if rtol and np.issubdtype(a[key].dtype, np.floating):
            assert rel_diff(a[key], b[key]) <= rtol, key
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def paths(variables, numbered: str = "", tied: Iterable[str] = ()) -> list[str]:
    """Each variable's path. A path met k times before gets `#k` (T5 holds two relative attention biases
    of one path), unless it is in `tied` (a tied weight's copies on several stages: one weight).
    `numbered`: a layer name Keras numbers (T5's `t5_layer_norm_7`; a stage's clone takes the next number),
    its number left out."""
    out = []
    met: dict[str, int] = {}
    for v in variables:
        p = re.sub(rf"{numbered}_\d+", numbered, v.path) if numbered else v.path
        k = met[p] = 0 if v.path in tied else met.get(p, -1) + 1
        out.append(f"{p}#{k}" if k else p)
    return out


def by_path(variables, numbered: str = "") -> dict[str, np.ndarray]:
    """Each variable's value by its path (`paths`)."""
    return {p: v.numpy() for p, v in zip(paths(variables, numbered), variables)}


def assert_trained_like_keras(
    run, reference, data, start: dict, leave_out: Sequence[str] = (), numbered: str = ""
) -> None:
    """`run.step` on each `(x, y)` of `data` (y the target `next` or `label`, whichever the run learns) against
    Keras' own `reference.train_on_batch` (compiled; a keras_hub task model's list of loss and metrics is read
    for its loss, which comes first): each loss within 1e-5, and every trainable variable of every stage (by
    path, `by_path`: `start` is the reference's before training, `numbered` as there) within 1e-5 of the
    reference's after them. A variable the reference left where it started (attention's key bias: a gradient
    of 0 in exact arithmetic) must stay within 1e-6 of its start. `leave_out`: endings of paths not compared
    (attention's key bias under Adam, which normalizes the bias's float noise into steps of the learning
    rate's size; docs: TRAPS)."""
    target = run.stages[-1].target.name
    for x, y in data:
        want = reference.train_on_batch(x, y)
        np.testing.assert_allclose(
            run.step(x, {target: y})["loss"], want[0] if isinstance(want, list) else want, rtol=1e-5
        )
    assert_variables_like(
        [v for s in run.stages for v in s.trainable_variables],
        by_path(reference.trainable_variables, numbered),
        start,
        leave_out,
        numbered,
        {c.name for s in run.stages for c in s.shared},
    )


def assert_variables_like(
    variables, want: dict, start: dict, leave_out: Sequence[str] = (), numbered: str = "", tied: Iterable[str] = ()
) -> None:
    """`variables` (a cut model's, every stage's; the copies of a weight in `tied` each) against the
    reference's after training, `want` (`by_path`; `start`: before it), as `assert_trained_like_keras` compares
    them: the same paths, each within 1e-5, one the reference left where it started within 1e-6 of its start,
    `leave_out` endings not compared."""
    keys = paths(variables, numbered, tied)
    for p, v in zip(keys, variables):
        if leave_out and p.endswith(tuple(leave_out)):
            continue
        if np.abs(want[p] - start[p]).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
            assert np.abs(v.numpy() - start[p]).max() < 1e-6, p
            continue
        assert rel_diff(v.numpy(), want[p]) <= 1e-5, p
    assert set(keys) == set(want)


def rel_diff(a, b) -> float:
    """Largest elementwise difference relative to the largest magnitude of the reference `b`."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def stage_vectors(run) -> list[np.ndarray]:
    """Each stage's trainable variables as one vector."""
    return [np.concatenate([v.numpy().ravel() for v in s.trainable_variables]) for s in run.stages]


def norm_rel_diff(a, b) -> float:
    """The difference's norm relative to the reference's norm (for low-precision comparisons)."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def assert_same_start(run, ref) -> list[np.ndarray]:
    """Both runs start from identical weights (they seed the same way; checked, not assumed);
    returns the reference's initial weights."""
    initial = weights(ref)
    for a, b in zip(weights(run), initial, strict=True):
        np.testing.assert_array_equal(a, b)
    return initial


def assert_trains_alike(run, ref, pairs: Iterable, rtol: float, moved: float) -> None:
    """Step `run` and `ref` on `pairs` of batches ((x, ys) for run, (x, ys) for ref: the same
    examples); every step's losses and the final weights agree within `rtol` (`rel_diff` per
    variable), and training moved `ref`'s weights by more than `moved` x `rtol` (equality is not
    trivial)."""
    initial = assert_same_start(run, ref)
    for (x, ys), (x_ref, ys_ref) in pairs:
        np.testing.assert_array_equal(x, x_ref)
        got, want = run.step(x, ys), ref.step(x_ref, ys_ref)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=rtol)
        np.testing.assert_allclose(got["stage_losses"], want["stage_losses"], rtol=rtol)
    for a, b, b0 in zip(weights(run), weights(ref), initial, strict=True):
        assert rel_diff(a, b) <= rtol
        assert rel_diff(b, b0) > moved * rtol


def same_batches(run, steps: int):
    """`steps` pairs of one batch of `run`'s stream, given to both runs."""
    it = iter(run.batches())
    for _ in range(steps):
        batch = next(it)
        yield batch, batch


def sgd_step(reference, device: str, lr: float):
    """`step(x, y) -> loss`: one compiled SGD step of `reference` on `device`, cross-entropy from
    logits, by a plain tape loop (the one-device oracle of a cut model)."""
    with tf.device(device):
        opt = keras.optimizers.SGD(learning_rate=lr)
        opt.build(reference.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.device(device):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, reference(x, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables))
        return loss

    return step


def microbatch_sgd_step(reference, device: str, lr: float, microbatches: int):
    """`step(x, y) -> loss`: one SGD step of `reference` on `device` in a plain tape loop (eager: a
    keras_hub model's dict inputs as they come), the batch cut into `microbatches` equal parts, each
    part's cross-entropy from logits plus its own `reference.losses` (the `add_loss` terms of that part's
    call) weighed by 1/microbatches, the gradients summed: the one-device oracle of
    `pipeline.add_loss=per_microbatch`."""
    with tf.device(device):
        opt = keras.optimizers.SGD(learning_rate=lr)
        opt.build(reference.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = reference.trainable_variables

    def step(x, y):
        xs = [tf.nest.map_structure(lambda t, k=k: tf.split(t, microbatches)[k], x) for k in range(microbatches)]
        total, sums = 0.0, [tf.zeros_like(v) for v in variables]
        with tf.device(device):
            for xm, ym in zip(xs, tf.split(y, microbatches)):
                with tf.GradientTape() as tape:
                    value = loss_fn(ym, reference(xm, training=True))
                    value = (value + tf.add_n([tf.cast(t, tf.float32) for t in reference.losses])) / microbatches
                sums = [a + tf.convert_to_tensor(g) for a, g in zip(sums, tape.gradient(value, variables))]
                total += float(value)
            opt.apply_gradients(zip(sums, variables))
        return total

    return step


def trains_like_one_device(run, reference, device: str, steps: int = 4, lr: float = 0.1, batches=None) -> None:
    """`steps` SGD steps of the chain equal the same steps of `reference` (a copy of the uncut
    model) in a tape loop on `device` on the same batches (`batches`, (x, {"label": y}) pairs; default
    the run's own) (losses and weights within 1e-5), and the weights moved."""
    start = [v.numpy() for v in reference.trainable_variables]
    ref_step = sgd_step(reference, device, lr)
    it = iter(run.batches() if batches is None else batches)
    for _ in range(steps):
        x, ys = next(it)
        np.testing.assert_allclose(run.step(x, ys)["loss"], float(ref_step(x, ys["label"])), rtol=1e-5)
    chained = [w for s in run.stages for w in s.model.trainable_variables]
    by_name = {v.path: v for v in reference.trainable_variables}
    assert len(chained) == len(by_name)
    moved = False
    for w, r, w0 in zip(chained, reference.trainable_variables, start, strict=True):
        if np.abs(r.numpy() - w0).max() < 1e-8:
            # a gradient that is 0 in exact arithmetic (attention's key bias: softmax ignores a shift
            # of every score), round-off in both: both stayed where they started
            assert np.abs(w.numpy() - w0).max() < 1e-8, (w.path, r.path)
            continue
        assert rel_diff(w.numpy(), r.numpy()) <= 1e-5, (w.path, r.path)
        moved |= rel_diff(r.numpy(), w0) > 1e-3
    assert moved
