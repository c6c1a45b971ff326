"""Schedule builders and the timeline simulator: pure Python, no TensorFlow involved."""

import itertools
import subprocess
import sys

import pytest

from chain.schedule import schedule_file, schedules
from chain.schedule.schedules import BACKWARD, FORWARD, Action

SIZES = [(1, 1), (1, 4), (2, 1), (2, 2), (3, 2), (3, 4), (4, 1), (4, 3), (4, 8), (5, 16), (8, 8)]
# F and B only, a device per stage (interleaved has tests of its own below)
UNSPLIT = [
    name for name in schedules.NAMES if name != "interleaved" and not schedules.is_split(schedules.build(name, 2, 2))
]
ALL = [(name, k, m) for name in UNSPLIT for k, m in SIZES]


@pytest.mark.parametrize("name, k, m", ALL)
def test_every_stage_runs_each_forward_and_backward_once_forward_first(name, k, m):
    s = schedules.build(name, k, m)
    assert (s.name, s.stages, s.microbatches) == (name, k, m)
    for stage, row in enumerate(s.actions):
        assert sorted(row) == sorted(Action(stage, mb, kind) for mb in range(m) for kind in (FORWARD, BACKWARD))
        for mb in range(m):
            assert row.index(Action(stage, mb, FORWARD)) < row.index(Action(stage, mb, BACKWARD))


@pytest.mark.parametrize("name, k, m", ALL)
def test_timeline_respects_neighbour_dependencies_and_stage_order(name, k, m):
    s = schedules.build(name, k, m)
    tl = schedules.simulate(s)
    slot = {a: t for row in tl.grid for t, a in enumerate(row) if a is not None}
    assert len(slot) == 2 * k * m
    for a, t in slot.items():
        if a.kind == FORWARD and a.stage > 0:
            assert slot[Action(a.stage - 1, a.microbatch, FORWARD)] < t
        if a.kind == BACKWARD:
            assert slot[Action(a.stage, a.microbatch, FORWARD)] < t
            if a.stage < k - 1:
                assert slot[Action(a.stage + 1, a.microbatch, BACKWARD)] < t
    for stage, row in enumerate(s.actions):  # each device runs its actions in the schedule's order
        assert [a for a in tl.grid[stage] if a is not None] == list(row)
    # The global order the engine traces in is a topological order of the same dependencies.
    seen = set()
    for a in tl.order():
        assert all(d in seen for d in schedules.dependencies(a, k))
        seen.add(a)


@pytest.mark.parametrize("k, m", SIZES)
def test_1f1b_keeps_at_most_k_activations_alive_per_stage(k, m):
    s = schedules.build("1f1b", k, m)
    for stage, row in enumerate(s.actions):
        live = schedules.live_activations(row)
        assert min(live) >= 0 and live[-1] == 0
        assert max(live) <= k
        assert max(live) == min(k - stage, m)  # the standard warm-up depth, not less
    # ... and in the simulated timeline too, counted per slot.
    tl = schedules.simulate(s)
    for row in tl.grid:
        assert max(schedules.live_activations([a for a in row if a is not None])) <= k


@pytest.mark.parametrize("k, m", SIZES)
def test_eager_1f1b_runs_stage_ks_forwards_k_minus_k_minus_1_backwards_earlier_for_as_many_more_activations(k, m):
    eager, plain = schedules.build("eager1f1b", k, m), schedules.build("1f1b", k, m)
    for stage, (row, base) in enumerate(zip(eager.actions, plain.actions)):
        ahead = min(2 * (k - stage) - 1, m)
        assert row[:ahead] == tuple(Action(stage, mb, FORWARD) for mb in range(ahead))
        assert max(schedules.live_activations(row)) == ahead  # 1F1B's min(K-k, M) and K-k-1 more
        for i in range(m - ahead):  # each forward after the warm-up: after B(i), in 1F1B after B(i + K-k-1)
            forward = Action(stage, ahead + i, FORWARD)
            assert row[row.index(forward) - 1] == Action(stage, i, BACKWARD)
            assert base[base.index(forward) - 1] == Action(stage, i + k - stage - 1, BACKWARD)
    assert schedules.simulate(eager).bubble_fraction == pytest.approx(schedules.simulate(plain).bubble_fraction)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_eager_1f1b_hides_a_crossings_time_that_1f1b_waits_for(k):
    """Equal stages (F one unit, B two) and a crossing of a quarter unit: in 1F1B a stage's next forward waits for
    its backward, which waits for the next stage's, so the next stage waits two crossings per microbatch; eager
    1F1B's forward ran before, so its step is shorter. Without the crossing both take the same time."""

    def step(name: str, crossing: float) -> float:
        timed = schedules.play_timed(
            schedules.build(name, k, 8),
            lambda a: 1.0 if a.kind == FORWARD else 2.0,
            wait=lambda needed, a: crossing if needed.stage != a.stage else 0.0,
        )
        return max(timed.end.values())

    assert step("eager1f1b", 0.0) == step("1f1b", 0.0)
    assert step("eager1f1b", 0.25) < step("1f1b", 0.25) - 1.0


@pytest.mark.parametrize("k, m", [(k, m) for k, m in SIZES if m > k])
def test_gpipe_holds_all_microbatches_where_1f1b_holds_k(k, m):
    gp = schedules.build("gpipe", k, m)
    assert max(schedules.live_activations(gp.actions[0])) == m
    assert max(schedules.live_activations(schedules.build("1f1b", k, m).actions[0])) == k < m


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("k, m", list(itertools.product([1, 2, 3, 4, 6], [1, 2, 3, 4, 8, 12])))
def test_bubble_fraction_is_k_minus_1_over_m_plus_k_minus_1(name, k, m):
    tl = schedules.simulate(schedules.build(name, k, m))
    assert tl.slots == 2 * (m + k - 1)
    assert tl.bubble_fraction == pytest.approx((k - 1) / (m + k - 1), abs=1e-12)


@pytest.mark.parametrize("k, m", [(1, 1), (2, 1), (3, 4), (4, 8)])
def test_sequential_runs_one_device_at_a_time(k, m):
    tl = schedules.simulate(schedules.build("sequential", k, m))
    assert all(sum(row[t] is not None for row in tl.grid) == 1 for t in range(tl.slots))
    assert tl.bubble_fraction == pytest.approx((k - 1) / k, abs=1e-12)


def test_a_schedule_that_cannot_run_is_refused():
    # Stage 1 wants B0 before F0 has been able to arrive: invalid.
    bad = schedules.Schedule(
        "bad", 2, 1, ((Action(0, 0, "F"), Action(0, 0, "B")), (Action(1, 0, "B"), Action(1, 0, "F")))
    )
    with pytest.raises(ValueError, match="B0 before F0"):
        schedules.simulate(bad)
    # Each order is valid alone, but stage 0 waits in B0 for stage 1, which waits in F1 for stage 0.
    stuck = schedules.Schedule(
        "stuck",
        2,
        2,
        (
            (Action(0, 0, "F"), Action(0, 0, "B"), Action(0, 1, "F"), Action(0, 1, "B")),
            (Action(1, 0, "F"), Action(1, 1, "F"), Action(1, 0, "B"), Action(1, 1, "B")),
        ),
    )
    with pytest.raises(ValueError, match="deadlock"):
        schedules.simulate(stuck)
    with pytest.raises(ValueError, match="not known"):
        schedules.build("zigzag", 2, 2)


def test_render_one_row_per_device_one_column_per_slot():
    s = schedules.build("1f1b", 3, 4)
    tl = schedules.simulate(s)
    text = schedules.render(s, tl, ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"])
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("stage ")]
    assert len(rows) == 3 and "/device:CPU:2" in rows[2]
    for k, line in enumerate(rows):
        cells = line.split("  ", 2)[-1].split()
        assert len(cells) <= tl.slots and cells == [str(a) if a else "." for a in tl.grid[k]][: len(cells)]
    assert f"bubble fraction: {tl.bubble_fraction:.3f}" in text


def test_schedules_module_does_not_import_tensorflow():
    code = "import sys, chain.schedule.schedules as s; s.simulate(s.build('1f1b', 4, 8)); print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("name, k, m", ALL + [("zb1", k, m) for k, m in SIZES])
def test_every_action_is_parsed_back_from_the_names_of_its_ops(name, k, m):
    """One vocabulary: the scope an action gives its ops reads back as that action, its
    forward's tape gradients as its backward, and the stage's update scope as the stage."""
    for row in schedules.build(name, k, m).actions:
        for a in row:
            assert Action.parse(a.scope()) == a
            assert Action.parse(f"{a.scope()}/stage_0{a.stage}_1/dense/MatMul") == a
            if a.kind == FORWARD:
                assert Action.parse(f"gradient_tape/{a.scope()}/dense/MatMul") == Action(
                    a.stage, a.microbatch, BACKWARD
                )
            assert schedules.update_stage(a.scope()) is None
    for stage in range(k):
        assert schedules.update_stage(schedules.update_scope(stage)) == stage
        assert schedules.update_stage(schedules.update_scope(stage) + "/Sum") == stage
        assert Action.parse(schedules.update_scope(stage)) is None


@pytest.mark.parametrize(
    "op_name",
    [
        "release_s0_F1",
        "microbatches",
        "s1_update",
        "s1_F",
        "s1_Fx/a",
        "s_F0",
        "sx_F0",
        "s1F0",
        "s1_F0_1/a",
        "s1_X0",
        "gradient_tape",
        "gradient_tape/s1",
        "a/s1_F0",
        "gradient_tape/gradient_tape/s1_F0",
        "s1_B0x",
        "stage_01/s1_F0",
    ],
)
def test_names_outside_every_action_parse_to_none(op_name):
    assert Action.parse(op_name) is None
    assert schedules.update_stage(op_name) is None or op_name == "s1_update"


@pytest.mark.parametrize("k, m", SIZES)
def test_zb1_runs_f_b_and_w_of_each_microbatch_once_in_order_and_keeps_1f1bs_peak(k, m):
    s = schedules.build("zb1", k, m)
    assert schedules.is_split(s) and not schedules.is_split(schedules.build("1f1b", k, m))
    for stage, row in enumerate(s.actions):
        assert sorted(row) == sorted(Action(stage, mb, kind) for mb in range(m) for kind in "FBW")
        for mb in range(m):
            assert (
                row.index(Action(stage, mb, "F"))
                < row.index(Action(stage, mb, "B"))
                < row.index(Action(stage, mb, "W"))
            )
        # F and B keep 1F1B's order; only the W's move.
        assert [a for a in row if a.kind != "W"] == list(schedules.build("1f1b", k, m).actions[stage])
        # W frees what F saved: no stage holds more microbatches than 1F1B's first stage (k).
        assert max(schedules.live_activations(row)) <= min(k, m) and schedules.live_activations(row)[-1] == 0
    tl = schedules.simulate(s)
    slot = {a: t for row in tl.grid for t, a in enumerate(row) if a is not None}
    for a, t in slot.items():
        assert all(slot[d] < t for d in schedules.dependencies(a, k))
        if a.kind == "W":
            assert slot[Action(a.stage, a.microbatch, "B")] < t


@pytest.mark.parametrize("k, m", [(k, m) for k, m in itertools.product([2, 3, 4, 8], [1, 2, 4, 8, 16]) if m >= k])
def test_zb1_idles_a_third_of_1f1bs_bubble(k, m):
    """F, B and W of one slot each: every stage idles k-1 slots, where 1F1B with a whole backward
    (B + W, two slots) idles 3(k-1): the bubble is (k-1)/(3m+k-1) (Qi et al., ZB-H1)."""
    tl = schedules.simulate(schedules.build("zb1", k, m))
    assert [sum(a is None for a in row) for row in tl.grid] == [k - 1] * k
    assert tl.bubble_fraction == pytest.approx((k - 1) / (3 * m + k - 1), abs=1e-12)


INTERLEAVED = [
    (k, d, m) for k, d in [(2, 1), (4, 2), (6, 2), (6, 3), (8, 4), (8, 2), (9, 3)] for m in (d, 2 * d, 4 * d)
]


@pytest.mark.parametrize("k, d, m", INTERLEAVED)
def test_interleaved_puts_stage_k_on_device_k_mod_d_and_runs_every_action_once_in_order(k, d, m):
    s = schedules.build("interleaved", k, m, d)
    assert s.devices == d and [s.row(stage) for stage in range(k)] == [stage % d for stage in range(k)]
    for r, row in enumerate(s.actions):
        assert sorted(row) == sorted(
            Action(stage, mb, kind) for stage in range(r, k, d) for mb in range(m) for kind in "FB"
        )
    tl = schedules.simulate(s)
    slot = {a: t for row in tl.grid for t, a in enumerate(row) if a is not None}
    for a, t in slot.items():
        assert all(slot[dep] < t for dep in schedules.dependencies(a, k))
    for r, row in enumerate(s.actions):
        assert [a for a in tl.grid[r] if a is not None] == list(row)
    # The anchors' bubble: V times smaller than 1F1B's on the same D devices.
    assert tl.bubble_fraction == pytest.approx((d - 1) / (k // d * m + d - 1), abs=1e-12)
    back = schedule_file.loads(schedule_file.dumps(s), k, m)
    assert back.actions == s.actions and back.stage_rows == s.stage_rows


def test_interleaved_needs_microbatches_a_multiple_of_the_devices():
    with pytest.raises(ValueError, match="3 microbatches are not a multiple of the 2 devices"):
        schedules.build("interleaved", 4, 3, 2)
    text = schedules.render(
        schedules.build("interleaved", 4, 2, 2), schedules.simulate(schedules.build("interleaved", 4, 2, 2))
    )
    assert "device 0 (stages 0, 2)" in text and "F0@s2" in text and "4 stages on 2 devices" in text


def test_the_schedule_line_counts_in_words():
    """`1 microbatch`, not `1 microbatches` (issue 38); other counts plural."""
    one = schedules.build("gpipe", 2, 1)
    assert (
        schedules.render(one, schedules.simulate(one))
        .splitlines()[0]
        .startswith("schedule: gpipe, 2 stages x 1 microbatch, 4 slots (")
    )
    single = schedules.build("gpipe", 1, 2)
    assert (
        schedules.render(single, schedules.simulate(single))
        .splitlines()[0]
        .startswith("schedule: gpipe, 1 stage x 2 microbatches, ")
    )
    from chain.errors import plural, there_are

    assert [
        plural(n, w) for n, w in [(1, "step"), (0, "step"), (3, "microbatch"), (1, "device"), (2, "entry"), (2, "day")]
    ] == ["1 step", "0 steps", "3 microbatches", "1 device", "2 entries", "2 days"]
    assert (there_are(1, "stage"), there_are(2, "stage")) == ("there is 1 stage", "there are 2 stages")


ZBV = [(d, m) for d in (1, 2, 3, 4) for m in (1, 2, 2 * d - 1, 2 * d, 3 * d, 4 * d)]


@pytest.mark.parametrize("d, m", ZBV)
def test_zbv_puts_stages_k_and_2d_1_k_on_device_k_and_runs_f_b_w_of_each_microbatch_once_in_order(d, m):
    k = 2 * d
    s = schedules.build("zbv", k, m)
    assert s.devices == d and s.stage_rows == tuple(min(stage, k - 1 - stage) for stage in range(k))
    assert schedules.rows_rule(s) == f"stage k and stage {k - 1}-k on device k" or d == 1
    for r, row in enumerate(s.actions):
        assert sorted(row) == sorted(
            Action(stage, mb, kind) for stage in (r, k - 1 - r) for mb in range(m) for kind in "FBW"
        )
        for stage in (r, k - 1 - r):
            for mb in range(m):
                assert (
                    row.index(Action(stage, mb, "F"))
                    < row.index(Action(stage, mb, "B"))
                    < row.index(Action(stage, mb, "W"))
                )
    tl = schedules.simulate(s)  # no deadlock, at any M (torch's builder plays max(M, 2D-1) and drops the rest)
    slot = {a: t for row in tl.grid for t, a in enumerate(row) if a is not None}
    for a, t in slot.items():
        assert all(slot[dep] < t for dep in schedules.dependencies(a, k, split=True))
    for r, row in enumerate(s.actions):
        assert [a for a in tl.grid[r] if a is not None] == list(row)
    back = schedule_file.loads(schedule_file.dumps(s), k, m)
    assert back.actions == s.actions and back.stage_rows == s.stage_rows


@pytest.mark.parametrize("d, m", [(d, m) for d, m in ZBV if m >= 2 * d])
def test_zbv_idles_half_of_zb1s_bubble_on_the_same_devices(d, m):
    """F, B and W of one slot each: at M >= 2D every device idles only D-1 slots, waiting for its first
    forward, and the V's turn and cool-down leave no gap. zb1 on the same D devices runs stages twice
    the size (F, B, W of two slots each) and idles D-1 of its slots: twice zbv's idle time. A device
    holds at most 2D microbatches' activations of a half-size stage at once: 1F1B's peak (D of a whole
    stage) on its first device, here on every device. Stage k's own peak is 2D-k."""
    tl = schedules.simulate(schedules.build("zbv", 2 * d, m))
    assert [sum(a is None for a in row) for row in tl.grid] == [d - 1] * d
    assert tl.bubble_fraction == pytest.approx((d - 1) / (6 * m + d - 1), abs=1e-12)
    zb1 = schedules.simulate(schedules.build("zb1", d, m))
    assert [2 * sum(a is None for a in row) for row in zb1.grid] == [2 * (d - 1)] * d
    s = schedules.build("zbv", 2 * d, m)
    assert schedules.held_counts(s) == [2 * d - k for k in range(2 * d)]
    assert [max(schedules.live_activations(row)) for row in s.actions] == [2 * d] * d
    assert max(schedules.live_activations(schedules.build("1f1b", d, m).actions[0])) == d


def test_zbv_needs_an_even_number_of_stages():
    with pytest.raises(ValueError, match="3 stages is not an even number"):
        schedules.build("zbv", 3, 4)
    text = schedules.render(schedules.build("zbv", 4, 4), schedules.simulate(schedules.build("zbv", 4, 4)))
    assert "device 0 (stages 0, 3)" in text and "device 1 (stages 1, 2)" in text and "4 stages on 2 devices" in text
