"""What `placement.plan=auto` shows of its work: the best candidates as a table (`plan_only=true`), the
chosen plan in one line (a run's log), the one line a run writes when its measured step is far
from the prediction, and summary.json's `plan` (`plan_fields`: the choice beside the measured step).

Everything is read from the search's `AutoPlan` (`chain.records.auto_plan`); nothing here searches
or measures. A candidate is named by its overrides (`Candidate.overrides`), shown compact in the
table (the key's last part: `microbatches=4`) and whole on the `chosen:` line, which a user pastes
after their own overrides to run the plan by hand. Memory is in MB of 2**20 bytes, as
`placement.memory_limit_mb`. Pure: no TensorFlow.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from chain.config import override_key
from chain.errors import plural
from chain.autoplan.cache import NAME as CACHE
from chain.autoplan.search import used_devices_of
from chain.planning.fit import MB
from chain.records.auto_plan import AutoPlan, Prediction
from chain.records.summaries import PlanFields, PlannedCandidate

_LOCAL = re.compile(r"(^|[\[,])/device:")  # a local device's prefix in a list of devices
UNKNOWN = "—"  # a device whose memory is not known (logical CPUs share the host's)


def compact(overrides: Sequence[str]) -> str:
    """Overrides as the table shows them: each key's last part (`pipeline.microbatches=4` ->
    `microbatches=4`), a local device by its short name (`/device:CPU:1` -> `CPU:1`)."""
    out = []
    for o in overrides:
        key, value = o.split("=", 1)
        out.append(override_key(key).rsplit(".", 1)[-1] + "=" + _LOCAL.sub(r"\1", value))
    return " ".join(out)


def devices(p: Prediction) -> list[str]:
    """The names of the devices a prediction's peaks are for: its candidate's (short: `CPU:1`), or
    numbered when the candidate leaves its devices to the planner."""
    return [_LOCAL.sub(r"\1", d) for d in used_devices_of(p)]


def memory_cells(p: Prediction) -> str:
    """Each device's predicted peak against its memory, in MB: `CPU:0 12.3/—, CPU:1 11.9/—`."""
    cells = []
    for name, peak, memory in zip(devices(p), p.peaks, p.memory):
        cells.append(f"{name} {_mb(peak)}/{UNKNOWN if memory is None else _mb(memory)}")
    return ", ".join(cells)


def _mb(n: int) -> str:
    """Bytes in MB: three significant digits below 100 MB (`0.0635`, `12.3`), whole MB above."""
    mb = n / MB
    return f"{mb:.0f}" if mb >= 100 else f"{mb:.3g}"


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as columns padded to their widest cell (the last column left ragged)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def planning_line(plan: AutoPlan) -> str:
    """How long planning took: `planning: measured in X s, searched N candidates in Y s (Z dropped: over memory)`,
    with whose measurements the run directory's cache held and why they were read or measured again."""
    return (
        f"planning: {measuring(plan)}, searched {plural(plan.candidates, 'candidate')} in {plan.searching_s:.2f} s "
        f"({plan.dropped_for_memory} dropped: over memory)"
    )


def measuring(plan: AutoPlan) -> str:
    """Where the measurements came from: the run directory's cache (whose, and the key that matched), or
    measured now (and why the cache's were not read)."""
    use = plan.cache
    whose = f"measured by {use.measured_by}" if use is not None and use.measured_by else "measured by an earlier run"
    if plan.cached and use is not None:
        return (
            f"measurements read from the run directory's {CACHE} ({whose}: the same model, batch, devices, "
            f"settings and versions, key {use.key})"
        )
    if plan.cached:
        return f"measurements read from the run directory's cache ({whose})"
    now = f"measured in {plan.measuring_s:.1f} s"
    if use is None:
        return now
    if use.differs == ("file",):
        return f"{now} (the run directory's {CACHE} held none this version reads)"
    return (
        f"{now} (the run directory's {CACHE} held measurements that differ in {' and '.join(use.differs)}, "
        f"key {use.their_key}, {whose}; this run's key {use.key})"
    )


def by_hand(plan: AutoPlan, user: Sequence[str]) -> str:
    """The command that runs the chosen plan by hand: the user's overrides but `placement.plan`,
    `plan_only` and the keys the plan sets, then the plan's overrides."""
    chosen = plan.chosen.candidate.overrides()
    dropped = {override_key(o) for o in chosen} | {"plan_only", "placement.plan", "placement.plan_budget_s"}
    kept = [o for o in user if override_key(o) not in dropped]
    return shlex.join(["python", "-m", "chain", *kept, *chosen])


def render(plan: AutoPlan, user: Sequence[str] | None = None) -> str:
    """plan_only=true: the best candidates (rank, overrides, predicted step, examples/s, bubble, each
    device's predicted peak against its memory), the chosen plan's overrides, and how long planning
    took. `user`: the command line's overrides, to print the whole command that runs the plan by hand."""
    rows = [("rank", "plan", "step ms", "examples/s", "bubble", "peak/memory MB per device")]
    for rank, p in enumerate(plan.ranked, 1):
        mark = "*" if p == plan.chosen else " "
        rows.append(
            (
                f"{rank}{mark}",
                compact(p.candidate.overrides()),
                f"{1000 * p.step_s:.2f}",
                f"{p.examples_per_s:,.0f}",
                f"{p.bubble:.2f}",
                memory_cells(p),
            )
        )
    lines = [
        f"placement.plan=auto: the best {plural(len(plan.ranked), 'candidate')} by predicted step "
        "(* chosen; the step is the schedule played on the measured times):",
        *_aligned(rows),
        "chosen: " + " ".join(plan.chosen.candidate.overrides()),
    ]
    if user is not None:
        lines.append(f"by hand: {by_hand(plan, user)}")
    lines.append(planning_line(plan))
    return "\n".join(lines)


def one_line(plan: AutoPlan) -> str:
    """The chosen plan as a run logs it before training."""
    p = plan.chosen
    return (
        f"placement.plan=auto chose {' '.join(p.candidate.overrides())}: predicted {1000 * p.step_s:.2f} ms per "
        f"step ({p.examples_per_s:,.0f} examples/s, bubble {p.bubble:.2f}); {planning_line(plan)}"
    )


def mismatch(
    plan: AutoPlan,
    measured_ms: float,
    steps: int,
    *,
    shared_threads: bool = False,
    data_wait_ms: float | None = None,
    traced: bool = False,
) -> str:
    """The one line a run logs when its measured step (`measured_ms`, the median over its first `steps`
    timed steps) is far from the prediction, with what may explain it: logical CPU devices of one
    process (they share one thread pool, so stages do not overlap as the play assumes), the wait
    for batches (`data_wait_ms`: a step's median wait, which the prediction leaves out), profiling (`traced`), or
    a machine busier (or quieter) than when the measurements were taken."""
    predicted = 1000 * plan.chosen.step_s
    ratio = measured_ms / predicted if predicted > 0 else float("inf")
    causes = []
    if ratio > 1:
        if shared_threads:
            causes.append(
                "the stages are logical CPU devices of one process, which share one thread pool, so they "
                "do not overlap as the prediction's play assumes"
            )
        if data_wait_ms is not None and data_wait_ms > 0.1 * measured_ms:
            causes.append(
                f"a step waited {data_wait_ms:.2f} ms for its batch (the median), which the prediction leaves out"
            )
        if traced:
            causes.append("trainer.profile traced these steps")
        causes.append("other work on the machine, or costs the measurements missed")
    else:
        causes.append(
            "the machine was busier while planning than now"
            + (" (the measurements came from the run directory's cache)" if plan.cached else "")
        )
    return (
        f"plan=auto predicted {predicted:.2f} ms per step, measured {measured_ms:.2f} ms ({ratio:.2f}×, the "
        f"median of the first {plural(steps, 'timed step')}): " + "; or ".join(causes)
    )


def plan_fields(plan: AutoPlan | None, measured_ms: float | None) -> PlanFields | None:
    """summary.json's `plan`: plan=auto's choice (None: a plan by hand), its predicted step next to the
    run's measured one (`measured_ms`, the median timed step; None: none was timed), the planning's
    times and counts, and the best candidates."""
    if plan is None:
        return None
    predicted = 1000.0 * plan.chosen.step_s
    return PlanFields(
        overrides=list(plan.chosen.candidate.overrides()),
        predicted_step_ms=predicted,
        measured_step_ms=measured_ms,
        ratio=measured_ms / predicted if measured_ms is not None and predicted > 0 else None,
        measuring_s=plan.measuring_s,
        searching_s=plan.searching_s,
        cached=plan.cached,
        measured_by=f"{plan.cache.measured_by}, key {plan.cache.key}" if plan.cached and plan.cache else None,
        candidates=plan.candidates,
        dropped_for_memory=plan.dropped_for_memory,
        ranked=[ranked_entry(rank, p) for rank, p in enumerate(plan.ranked, 1)],
    )


def ranked_entry(rank: int, p: Prediction) -> PlannedCandidate:
    """One ranked candidate's row of `plan.ranked`."""
    c = p.candidate
    return PlannedCandidate(
        rank=rank,
        overrides=list(c.overrides()),
        predicted_step_ms=1000.0 * p.step_s,
        examples_per_second=p.examples_per_s,
        bubble_fraction=p.bubble,
        devices=list(dict.fromkeys(c.devices)) if c.devices is not None else None,
        peak_bytes=list(p.peaks),
        memory_bytes=list(p.memory),
    )
