"""chain.pipeline.memory_trace: the live set at a step's memory peak, rebuilt from the allocator's
events in a profiler trace, and named by the actions' scopes."""

from __future__ import annotations

from chain.pipeline import memory_trace as mt
from chain.pipeline.memory_trace import MemoryEvent

MIB = 1 << 20


def _alloc(t: int, addr: int, size: int, in_use: int, op: str, chunk: int | None = None) -> MemoryEvent:
    return MemoryEvent(True, t, addr, size, chunk or size, in_use, op=op, region="output")


def _free(t: int, addr: int, size: int, in_use: int) -> MemoryEvent:
    return MemoryEvent(False, t, addr, size, size, in_use)


def test_the_live_set_at_the_peak_is_matched_by_address_and_named_by_scope():
    base = 10 * MIB  # weights, allocated before the trace
    events = [
        _alloc(1, 100, MIB, base + MIB, "s0_F0/stage_00/dense/Relu"),
        _alloc(2, 200, MIB, base + 2 * MIB, "s0_F1/stage_00/dense/Relu"),
        _free(3, 100, MIB, base + MIB),  # F0's activation died before the peak
        _alloc(4, 100, MIB // 2, base + 2 * MIB, "s0_B1/stage_00/dense/Relu", chunk=MIB),  # its address reused
        _alloc(5, 300, MIB, base + 3 * MIB, "gradient_tape/s0_B0/stage_00/dense/MatMul/MatMul_1"),
        _alloc(6, 400, MIB, base + 4 * MIB, "gradient_tape/s0_B1/stage_00/dense/MatMul/MatMul_1"),
        _alloc(7, 500, MIB, base + 5 * MIB, "gradient_tape/s0_B1/stage_00/dense/MatMul/MatMul"),  # the peak
        _free(8, 500, MIB, base + 4 * MIB),
        _free(9, 999, 2 * MIB, base + 2 * MIB),  # allocated before the trace, live at the peak
        _alloc(10, 600, 3 * MIB, base + 5 * MIB - MIB // 2, "s0_F2/stage_00/dense/Relu"),  # after the peak
    ]
    peak = mt.live_at_peak(events)
    assert peak.in_use == base + 5 * MIB and peak.time_ps == 7
    parts = peak.breakdown()
    assert parts[mt.FORWARD_ACTIVATIONS] == (MIB, MIB)
    assert parts[mt.REPLAY_ACTIVATIONS] == (MIB // 2, MIB)  # requested against the chunk handed out
    assert parts[mt.GRADIENT_SUMS] == (MIB, MIB)  # the oldest gradient of the weight is its sum
    assert parts[mt.WEIGHT_GRADIENTS] == (MIB, MIB)  # a later microbatch's, not yet added
    assert parts[mt.OUTPUT_GRADIENTS] == (MIB, MIB)
    assert parts[mt.UNTRACED] == (2 * MIB, 2 * MIB)
    assert parts[mt.BEFORE] == (base - 2 * MIB, base - 2 * MIB)  # the rest of what was in use
    # one step of several: its own peak
    assert mt.live_at_peak(events, within=(9, 10)).in_use == base + 5 * MIB - MIB // 2


def test_a_profiled_function_shows_its_kept_tensor_live_at_the_peak(tmp_path):
    import tensorflow as tf

    x = tf.random.uniform([MIB // 4])  # 1 MiB of float32

    @tf.function
    def step(x):
        with tf.name_scope("s0_F0"):
            kept = tf.sin(x)  # lives until the end: the function returns it
        with tf.name_scope("s0_B0"):
            replayed = tf.cos(kept)
            return kept, tf.reduce_sum(replayed * kept)

    step(x)
    tf.profiler.experimental.start(str(tmp_path))
    step(x)
    tf.profiler.experimental.stop()
    peak = mt.peak_of(str(tmp_path))
    ops = {t.event.op: t.requested for t in peak.live if t.event is not None}
    assert ops.get("s0_F0/Sin") == MIB, ops
    assert peak.breakdown()[mt.FORWARD_ACTIVATIONS][0] == MIB
    assert peak.breakdown()[mt.REPLAY_ACTIVATIONS][0] >= MIB  # the cosine (or the product, reusing it)


def test_zb1_adds_each_ws_weight_gradients_to_the_sums_before_its_next_action(tmp_path):
    """The trace of a zb1 step: at its peak no stage holds more than about one layer's weight gradients
    besides the sums. Before `step.summed_in_turn`, Grappler folded each stage's additions into one AddN
    after its last W, and every W's gradients lived until then (M-1 microbatches' worth per stage)."""
    import tensorflow as tf

    import chain

    run = chain.build(
        chain.compose(
            [
                "+stages=2",
                "mode=e2e",
                "pipeline.schedule=zb1",
                "pipeline.microbatches=4",
                "model=mlp",
                "model.width=64",
                "model.depth=2",
                "optim=sgd",
                "data=synthetic",
                "data.features=16",
                "data.batch_size=64",
                "data.samples=256",
                "trainer.progress=false",
            ]
        )
    )
    it = iter(run.batches())
    run.step(*next(it))
    tf.profiler.experimental.start(str(tmp_path))
    run.step(*next(it))
    tf.profiler.experimental.stop()
    parts = mt.peak_of(str(tmp_path)).breakdown()
    weights = 4 * sum(s.params for s in run.stages)
    layer = 4 * (64 * 64 + 64)  # the largest layer's weights
    assert parts[mt.GRADIENT_SUMS][0] >= weights - layer, (parts, weights)  # the sums are found
    assert parts[mt.WEIGHT_GRADIENTS][0] <= 2 * layer, (parts, weights)
