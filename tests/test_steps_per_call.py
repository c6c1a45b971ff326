"""trainer.steps_per_call: N steps in one call of the compiled function are N single steps,
batch for batch and bit for bit; on_nan=stop ends the call at the bad step; the data
stream's position (and its checkpoint) is the same as after N single steps."""

import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.steps.numerics import NonFiniteError
from conftest import EXTENDED

SMALL = ["model.width=8", "model.dropout=0.25", "data.batch_size=16", "trainer.progress=false", "+stages=2"]
MODES = {
    "local": [],
    "local-accum": ["trainer.grad_accum=2"],
    "e2e-1f1b": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
    "e2e-zb1": ["mode=e2e", "pipeline.schedule=zb1", "pipeline.microbatches=2"],
    # 4 stages on 2 devices, stage k on device k mod 2 (the later "+stages=4" wins over SMALL's 2)
    "e2e-interleaved": [
        "mode=e2e",
        "pipeline.schedule=interleaved",
        "+stages=4",
        "pipeline.virtual_stages=2",
        "pipeline.microbatches=2",
        "model.depth=1",
    ],  # one layer a stage: four stages trace fast
    "local-xla": ["trainer.jit_compile=true"],
    "e2e-float16": ["mode=e2e", "precision=mixed_float16", "pipeline.microbatches=2"],
    "mirrored-local": ["placement.fallback=mirrored"],
    "mirrored-e2e": ["mode=e2e", "placement.fallback=mirrored"],
}
N = 5


def state(run) -> list[np.ndarray]:
    """Weights, optimizer slots and iterations, dropout seeds, guard counters and loss scales of every stage."""
    out = []
    for s in run.stages:
        out += [v.numpy().copy() for v in s.trainable_variables + list(s.optimizer.variables) + s.random_variables()]
        out.append(s.skipped.numpy())
        if s.loss_scale is not None:
            out += [v.numpy() for v in (s.loss_scale.scale, s.loss_scale.good_steps, s.loss_scale.overflows)]
    return out


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def batches_equal(a, b) -> bool:
    (xa, ya), (xb, yb) = a, b
    return np.array_equal(xa.numpy(), xb.numpy()) and all(np.array_equal(ya[k].numpy(), yb[k].numpy()) for k in ya)


def pair(*overrides):
    """Two identically built runs of the same config (same seed: same initial state)."""
    cfg = chain.compose([*SMALL, *overrides])
    one, many = chain.build(cfg), chain.build(cfg)
    assert same(state(one), state(many))
    return one, many


# The suite's time: local, e2e's 1f1b and float16, and mirrored-e2e run every time; zb1 and interleaved are other
# schedules of the same e2e call and resume, mirrored-local the same mirrored call, accum local's in chunks, and
# local-xla the same call compiled (XLA's training in tests/test_xla.py).
EXTENDED_MODES = {"e2e-zb1", "e2e-interleaved", "mirrored-local", "local-accum", "local-xla"}


@pytest.mark.parametrize("mode", [pytest.param(m, marks=EXTENDED if m in EXTENDED_MODES else ()) for m in MODES])
def test_n_steps_in_one_call_equal_n_single_steps_bit_for_bit(mode, tmp_path):
    """N steps in one call are N single steps; and mode=e2e (every schedule, zb1 and interleaved
    among them): a run resumed from its checkpoint between the two calls ends where it ended."""
    one, many = pair(*MODES[mode])
    singles = [one.step(*next(one.iterator)) for _ in range(2 * N)]
    called = many.steps(N)
    if mode.startswith("e2e"):
        many.checkpoints(str(tmp_path)).save(N, None, None)
    called += many.steps(N)  # the same function, called twice: no retrace needed
    assert [o["loss"] for o in called] == [o["loss"] for o in singles]
    assert [o["stage_losses"] for o in called] == [o["stage_losses"] for o in singles]
    assert many.global_step == one.global_step == 2 * N
    assert same(state(many), state(one))
    assert batches_equal(next(many.iterator), next(one.iterator))  # the stream is at the same position
    if not mode.startswith("mirrored"):  # a mirrored run splits batches on the host: n single calls
        assert many.strategy._multi.experimental_get_tracing_count() == 1
        many.steps(3)  # a shorter call reuses the same trace (n is a tensor)
        assert many.strategy._multi.experimental_get_tracing_count() == 1
    if not mode.startswith("e2e"):
        return  # the pipeline schedules resume below; the other modes' resumes have tests of their own
    # Resume: `many`, moved on past step 2N, restores its checkpoint of step N (every stage, the
    # optimizer slots, the dropout seeds, the data stream) and runs the second N steps again.
    assert many.restore(str(tmp_path))["step"] == N and many.global_step == N
    again = many.steps(N)
    assert [o["loss"] for o in again] == [o["loss"] for o in called[N:]]
    assert same(state(many), state(one))


def test_the_iterator_checkpoint_after_a_call_resumes_at_the_next_batch(tmp_path):
    one, many = pair()
    many.steps(N)
    for _ in range(N):
        one.step(*next(one.iterator))
    path = tf.train.Checkpoint(iterator=many.iterator).save(str(tmp_path / "data"))
    fresh = iter(many.batches())
    tf.train.Checkpoint(iterator=fresh).restore(path).assert_consumed()
    assert batches_equal(next(fresh), next(one.iterator))


def poisoned(run, at: int):
    """The run's stream with a NaN in the input of batch `at` (0-based)."""

    def poison(i, batch):
        x, ys = batch
        bad = tf.tensor_scatter_nd_update(x, [[0, 0, 0, 0]], [np.nan])
        return tf.cond(tf.equal(i, at), lambda: bad, lambda: x), ys

    return iter(run.batches().enumerate().map(poison))


# The suite's time: stop and skip each run every time locally and in one of e2e-1f1b and mirrored-e2e.
EXTENDED_BAD = {("stop", "mirrored-e2e"), ("skip", "e2e-1f1b")}


@pytest.mark.parametrize(
    "on_nan, mode",
    [
        pytest.param(on_nan, mode, marks=EXTENDED if (on_nan, mode) in EXTENDED_BAD else ())
        for mode in ["local", "e2e-1f1b", "mirrored-e2e"]
        for on_nan in ["stop", "skip"]
    ],
)
def test_a_bad_step_inside_a_call_is_named_and_stop_applies_nothing_after_it(on_nan, mode):
    # Linear activations carry the NaN through both stages (see test_checkpoints).
    one, many = pair(*MODES[mode], "model.activation=linear", f"trainer.on_nan={on_nan}")
    bad = 2  # the third batch: step 3
    one._iterator, many._iterator = poisoned(one, bad), poisoned(many, bad)
    singles = []
    if on_nan == "stop":
        with pytest.raises(NonFiniteError, match=r"^stage 0, stage 1: .* at step 3;"):
            for _ in range(N):
                singles.append(one.step(*next(one.iterator)))
        with pytest.raises(NonFiniteError, match=r"^stage 0, stage 1: .* at step 3;"):
            many.steps(N)
        # The call ended at the bad step: no later update, no later batch taken.
        assert many.global_step == one.global_step == bad + 1
    else:
        singles = [one.step(*next(one.iterator)) for _ in range(N)]
        called = many.steps(N)
        assert [o["skipped"] for o in called] == [o["skipped"] for o in singles]
        assert called[bad]["skipped"] == [0, 1]
    assert same(state(many), state(one))
    assert [int(s.skipped.numpy()) for s in many.stages] == [1, 1]
    assert batches_equal(next(many.iterator), next(one.iterator))


def test_fit_with_steps_per_call_matches_fit_without_and_resumes_bit_exact(tmp_path):
    """Calls end at checkpoints and at trainer.steps (7 = 3 + 1 + 3 with every=4, N=3); a run
    of 4 steps resumed to 7, both with N=3, ends where the single-step run ends."""
    runs = {}
    for n in (1, 3):
        cfg = chain.compose(
            [*SMALL, "trainer.steps=7", "checkpoint.every=4", "checkpoint.export=false", f"trainer.steps_per_call={n}"]
        )
        run = chain.build(cfg, run_dir=str(tmp_path / f"n{n}"))
        runs[n] = (run, run.fit())
    (a, sa), (b, sb) = runs[1], runs[3]
    assert same(state(a), state(b))
    assert sa["loss_first"] == sb["loss_first"] and sa["loss_last"] == sb["loss_last"]
    assert b.checkpoints().latest()["complete"] == [4, 7]
    common = [*SMALL, "checkpoint.every=4", "checkpoint.export=false", "trainer.steps_per_call=3"]
    chain.build(chain.compose([*common, "trainer.steps=4"]), run_dir=str(tmp_path / "resumed")).fit()
    resumed = chain.build(chain.compose([*common, "trainer.steps=7", "resume=true"]), run_dir=str(tmp_path / "resumed"))
    assert resumed.fit()["resumed_from"] == 4
    assert same(state(resumed), state(a))


def test_the_loop_gives_each_batch_its_size_as_a_static_shape_and_checks_it():
    """A stream's batch dimension is unknown to tf.data (None): traced on it, a step in the loop would work out
    its shapes at run time every step. The loop fixes the batch dimension to the step's examples, as one step
    per call sees it, and a batch of another size is an error, never reshaped."""
    from chain.steps.report import ReportFormat, repeat

    traced = []

    def body(x, ys):
        traced.append((x.shape.as_list(), ys["y"].shape.as_list()))
        return tf.stack([tf.reduce_sum(x), tf.reduce_sum(tf.cast(ys["y"], tf.float32))])

    fmt = ReportFormat(2, (0,), (1,))
    data = tf.data.Dataset.range(10).map(lambda i: (tf.fill([3], tf.cast(i, tf.float32)), {"y": i}))
    whole = iter(data.batch(4))  # 4, 4, then a last batch of 2
    assert whole.element_spec[0].shape.as_list() == [None, 3]
    steps = repeat(body, fmt, False, 4)
    rows, _ = steps(whole, tf.constant(2))
    assert traced == [([4, 3], [4])]
    np.testing.assert_array_equal(rows.numpy(), [[6 * 3, 6], [22 * 3, 22]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        steps(whole, tf.constant(1))  # the batch of 2
