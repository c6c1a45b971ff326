"""placement.plan=auto's search on synthetic costs (no TensorFlow): the cut follows the measured times,
microbatches shrink the bubble until the per-action cost wins, devices sharing one physical device
run one action at a time, and the memory estimate drops plans."""

import pytest

from chain.autoplan import search
from chain.errors import ConfigError
from chain.records.auto_plan import Costs
from chain.schedule import schedules


def costs(times, *, sizes=(1, 64), action_s=0.0, devices=4, shared=False, transfer=0.0, crossing=16, fixed=False):
    """Costs of links whose F+B+W per example is `times[j]` (F a third each), linear in the microbatch."""
    rows = [tuple(t / 3 * s for s in sizes) for t in times]
    n = len(times)
    pool = tuple(f"/device:CPU:{i}" for i in range(devices))
    return Costs(
        links=tuple((j, j + 1) for j in range(n)),
        sizes=tuple(sizes),
        forward=tuple(rows),
        input_grad=tuple(rows),
        weight_grad=tuple(rows),
        update=(0.0,) * n,
        update_s=0.0,
        crossing=(crossing,) * n,
        params=(100,) * n,
        action_s=action_s,
        step_s=0.0,
        transfer_s_per_byte=transfer,
        transfer_latency_s=0.0,
        exchange_s_per_byte=0.0,
        exchange_latency_s=0.0,
        devices=pool,
        physical=tuple("CPU:0" if shared else d for d in pool),
        fixed_cut=fixed,
    )


def test_a_heavy_last_link_moves_the_cut():
    even = search.cut_for(costs([1.0] * 6), 2, 8)
    heavy = search.cut_for(costs([1.0] * 5 + [5.0]), 2, 8)
    assert even == [3, 3]
    assert heavy == [5, 1]


def _step(c, schedule, m, recompute="never", batch=64, k=2):
    cand = search.Candidate(1, k, m, schedule, recompute)
    bounds = [0, *[(j + 1) * len(c.links) // k for j in range(k)]]
    return search.predict(c, cand, bounds, batch).step_s


def test_more_microbatches_shrink_the_bubble_until_the_per_action_cost_wins():
    free = costs([1e-3] * 4, action_s=0.0)
    steps = [_step(free, "gpipe", m) for m in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(steps, steps[1:]))  # no cost per action: more is always better
    paid = costs([1e-3] * 4, action_s=2e-3)
    steps = [_step(paid, "gpipe", m) for m in (1, 2, 4, 8, 16, 32, 64)]
    best = steps.index(min(steps))
    assert 0 < best < len(steps) - 1  # the bubble first, then the actions' own cost
    plan = search.search(paid, 64, [2])
    assert plan.chosen.candidate.microbatches == (1, 2, 4, 8, 16, 32, 64)[best] or plan.chosen.step_s <= min(steps)


def test_a_shared_physical_device_runs_its_actions_one_at_a_time():
    apart, shared = costs([1e-3] * 4), costs([1e-3] * 4, shared=True)
    total = 64 * 4 * 1e-3  # every link's F+B+W over the batch
    assert _step(shared, "1f1b", 8) == pytest.approx(total + search.LOOP_S)
    assert _step(apart, "1f1b", 8) < 0.7 * total
    # one copy on each of two physical devices: each runs half the batch at once
    two = search.predict(apart, search.Candidate(2, 2, 4, "gpipe", devices=None), [0, 2, 4], 64).step_s
    assert two < _step(apart, "gpipe", 4)


def test_the_transfer_delays_a_crossing():
    near, far = costs([1e-3] * 4), costs([1e-3] * 4, transfer=1e-6)
    assert _step(far, "gpipe", 4) > _step(near, "gpipe", 4)


def test_every_candidate_is_a_legal_schedule():
    found = search.candidates(costs([1.0] * 4), 8, [1, 2, 3, 4])
    assert found
    for c, _bounds in found:
        d = c.stages // 2 if c.schedule == "interleaved" else None
        schedules.simulate(schedules.build(c.schedule, c.stages, c.microbatches, d))
        assert c.replicas * (c.stages // 2 if c.schedule in ("interleaved", "zbv") else c.stages) <= 4
        assert 8 % (c.replicas * c.microbatches) == 0
        assert c.recompute == "never" or c.schedule not in ("zb1", "zbv")
        assert sum(c.split) == 4 and len(c.split) == c.stages


def test_a_built_in_model_keeps_its_stages():
    found = search.candidates(costs([1.0] * 3, fixed=True), 8, [3])
    assert {c.stages for c, _ in found} == {3} and all(c.split is None for c, _ in found)


def test_memory_limits_drop_candidates_and_nothing_fitting_is_one_line():
    c = costs([1e-3] * 4)

    def peaks(cand, schedule):  # activations held grow with the microbatches held: gpipe holds M
        held = schedules.held_counts(schedule)
        return [1000 + 100 * h * (64 // cand.replicas // cand.microbatches) for h in held]

    free = search.search(c, 64, [2], peaks=peaks)
    memory = {d: 5000 for d in c.devices}
    limited = search.search(c, 64, [2], peaks=peaks, memory=memory)
    assert limited.dropped_for_memory > 0
    for p in limited.ranked:
        assert p.fits and max(p.peaks) <= 5000
    assert free.chosen.step_s <= limited.chosen.step_s
    with pytest.raises(ConfigError) as e:
        search.search(c, 64, [2], peaks=peaks, memory={d: 1000 for d in c.devices})
    text = str(e.value)
    assert "\n" not in text and "more than its" in text and "data.batch_size" in text
