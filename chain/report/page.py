"""The report as one self-contained HTML page: every figure is a PNG embedded as a data URI,
the styles are inline, nothing is fetched when the page is viewed.

One run (`single`): its curves (the chain's, then each stage's), the placement table, with
placement.plan=auto the chosen plan's predicted step beside the measured one and the ranked
candidates, the planned and measured timelines with the measured statistics and the balance
advice, peak memory per device, throughput, and the config with its overrides. Several runs
(`comparison`): a table of final metrics, and curves overlaid run on run.
"""

from __future__ import annotations

import base64
import html
import os
from typing import Iterable, Sequence

from chain.errors import ChainError, plural
from chain.schedule import schedules
from chain.pipeline import measured_grid
from chain.pipeline import timeline as measured_timeline
from chain.records.measured import MeasuredTimeline, MeasuredStep
from chain.report import plots
from chain.report.runs import RunRecord

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 15px; margin-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; } th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }
.note { color: #555; font-size: 13px; } .advice { background: #fff4e5; border-left: 4px solid #f0a030; padding: 6px 10px; }
img { max-width: 100%; }
"""


def esc(value) -> str:
    return html.escape(str(value))


def image(data: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def number(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e5 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else esc(v)


def table(header: Sequence[str], rows: Iterable[Sequence], table_id: str | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{number(c)}</td>'
            if isinstance(c, (int, float)) and not isinstance(c, bool)
            else f"<td>{esc('-' if c is None else c)}</td>"
            for c in r
        )
        + "</tr>"
        for r in rows
    )
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


def mib(n) -> float | None:
    return n / 2**20 if isinstance(n, (int, float)) else None


# --- sections of one run -----------------------------------------------------------------------


def scalar_list(tags: dict) -> str:
    """What a curve image draws: each tag and its number of points."""
    return "scalars: " + ", ".join(f"{t} ({plural(len(p), 'point')})" for t, p in sorted(tags.items()))


def curve_section(rec: RunRecord) -> str:
    """Every scalar of tb/: the chain's (once), then each stage's own; a stage that logged none
    (mode=e2e: one loss, the chain's) is named in a note, not drawn again with the chain's."""
    out = ["<h2>Curves</h2>"]
    chain_tags = rec.curves.get("chain", {})
    if chain_tags:
        out.append(image(plots.curves({"": chain_tags}, f"{rec.name}: the chain (tb/chain)"), "chain curves"))
        out.append(f'<p class="note" id="scalars-chain">{esc(scalar_list(chain_tags))}</p>')
    silent = []
    for k, writer in enumerate(rec.stage_writers()):
        tags = rec.curves.get(writer, {})
        if not tags:
            silent.append(k)
            continue
        out.append(f'<h3 id="curves-stage-{k}">stage {k}</h3>')
        out.append(image(plots.curves({"": tags}, f"stage {k} ({writer})"), f"stage {k} curves"))
        out.append(f'<p class="note" id="scalars-stage-{k}">{esc(scalar_list(tags))}</p>')
    if silent:
        why = " (mode=e2e: the chain has one loss, drawn above)" if rec.facts.mode == "e2e" else ""
        out.append(
            f'<p class="note" id="silent-stages">{plural(len(silent), "stage")} ('
            f"{', '.join(map(str, silent))}) logged no scalars of their own{why}.</p>"
        )
    return "\n".join(out)


def placement_section(rec: RunRecord) -> str:
    rows = []
    for s in rec.stages:
        rows.append(
            (
                s.index,
                s.device or "every replica",
                s.physical,
                s.params,
                s.model,
                mib(s.peak_memory_bytes),
                s.measured.busy_fraction if s.measured else None,
            )
        )
    out = [
        "<h2>Assignment</h2>",
        table(
            (
                "variant" if rec.facts.mode == "side_by_side" else "stage",
                "device",
                "physical",
                "params",
                "model",
                "peak memory (MiB)",
                "measured busy fraction",
            ),
            rows,
            "placement",
        ),
    ]
    if rec.mirrored.replica_devices:
        out.append(f"<p class='note'>mirrored over {esc(', '.join(rec.mirrored.replica_devices))}</p>")
    if rec.facts.peak_memory_scope == "process":
        out.append(
            "<p class='note'>peak memory on CPU is the process's (logical CPU devices share one allocator): "
            "every stage shows the same figure.</p>"
        )
    return "\n".join(out)


def plan_section(rec: RunRecord) -> str:
    """placement.plan=auto: predicted against measured (step and examples/s), the chosen plan's overrides,
    the planning's times, and the best candidates; nothing for a plan by hand."""
    plan = rec.facts.plan
    if plan is None:
        return ""
    per_step = rec.facts.examples_per_step

    def rate(ms) -> int | None:
        return round(per_step * 1000.0 / ms) if isinstance(ms, (int, float)) and ms > 0 and per_step else None

    rows = [
        ("step (ms)", plan.predicted_step_ms, plan.measured_step_ms),
        ("examples per second", rate(plan.predicted_step_ms), rate(plan.measured_step_ms)),
    ]
    ratio = f"{plan.ratio:.2f}×" if plan.ratio is not None else "not measured (the run made one call)"
    measuring = (
        f"read from the run directory's cache (measured by {plan.measured_by})"
        if plan.measured_by
        else "read from the run directory's cache"
        if plan.cached
        else f"measured in {number(plan.measuring_s, 3)} s"
    )
    out = [
        '<h2 id="plan">Plan</h2>',
        table(("", "predicted", "measured"), rows, "plan"),
        f"<p>measured / predicted: <b>{esc(ratio)}</b> (measured: the median timed step)</p>",
        f"<p>chosen: <code>{esc(' '.join(plan.overrides or []))}</code></p>",
        f"<p class='note'>planning: {esc(measuring)}, searched {number(plan.candidates)} candidates in "
        f"{number(plan.searching_s, 3)} s ({number(plan.dropped_for_memory)} dropped: over memory)</p>",
    ]
    if plan.ranked:

        def memory(r) -> str:
            return ", ".join(
                f"{number(mib(peak), 3)} / {'—' if m is None else number(mib(m), 4)}"
                for peak, m in zip(r.peak_bytes or [], r.memory_bytes or [])
            )

        out.append(
            table(
                ("rank", "overrides", "predicted step (ms)", "examples/s", "bubble", "peak / memory (MiB)"),
                [
                    (
                        r.rank,
                        " ".join(r.overrides or []),
                        r.predicted_step_ms,
                        rate(r.predicted_step_ms),
                        r.bubble_fraction,
                        memory(r),
                    )
                    for r in plan.ranked
                ],
                "candidates",
            )
        )
    return "\n".join(out)


def planned_rows(schedule: schedules.Schedule) -> list[list[tuple[float, float, str, str]]]:
    grid = schedules.simulate(schedule).grid
    return [[(t, 1.0, a.kind, str(a)) for t, a in enumerate(row) if a is not None] for row in grid]


def measured_rows(measured: MeasuredTimeline, step: MeasuredStep) -> list[list[tuple[float, float, str, str]]]:
    """A row per stage of every copy of the pipeline (`timeline.row_of`: copy 0's stages first)."""
    t0 = min(a.start_ms for a in step.actions)
    k = measured.stages
    rows: list[list] = [[] for _ in range(k * (measured.replicas or 1))]  # None: a timeline.json from before copies
    for a in step.actions:
        action = measured_timeline.action(a)  # the schedule's action, named as the plan names it
        rows[measured_timeline.row_of(a.stage, action.replica, k)].append(
            (a.start_ms - t0, a.end_ms - a.start_ms, action.kind, str(action))
        )
    for u in step.updates:
        rows[measured_timeline.row_of(u.stage, u.replica or 0, k)].append(
            (u.start_ms - t0, u.end_ms - u.start_ms, "update", "")
        )
    return rows


def timeline_section(rec: RunRecord) -> str:
    schedule = rec.schedule()
    if schedule is None:
        return "<h2>Timeline</h2><p class='note'>no pipeline schedule (mode=local, or mirrored): nothing to plan.</p>"
    devices = [s.device or "" for s in rec.stages]
    labels = [f"stage {k}  {d}" for k, d in enumerate(devices)]
    planned = schedules.simulate(schedule)
    # The plan has a row per device; interleaved stages share one (the measured chart: a row per stage).
    rows = (
        [f"device {r} (stages {', '.join(map(str, schedule.row_stages(r)))})" for r in range(schedule.devices)]
        if schedule.stage_rows
        else labels
    )
    out = [
        '<h2 id="timeline">Timeline</h2>',
        f"<p>{esc(schedule.name)}, {plural(schedule.stages, 'stage')} x {plural(schedule.microbatches, 'microbatch')}; "
        f"planned bubble fraction {planned.bubble_fraction:.3f} (unit-time actions)</p>",
        image(plots.gantt(planned_rows(schedule), rows, "planned (unit-time actions)", "slot"), "planned timeline"),
    ]
    try:
        return "\n".join(out + measured_section(rec, labels))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        # the measured part reads timeline.json alone: what fails here is a file edited or damaged
        raise ChainError(
            f"{os.path.join(rec.path, 'timeline.json')} is not a timeline chain wrote "
            f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
        ) from None


def measured_section(rec: RunRecord, labels: Sequence[str]) -> list[str]:
    """The measured timeline (`timeline.json`): its Gantt chart, statistics and balance advice."""
    out = []
    m = rec.timeline
    if m is None:
        out.append("<p class='note'>not profiled: run with trainer.profile=[START,STOP] to measure the timeline.</p>")
        return out
    step = measured_timeline.shown(m)
    if step is None:
        out.append(
            f"<p class='note'>profiled, but {html.escape(measured_grid.unmeasured(bool(rec.facts.jit_compile)))}.</p>"
        )
        return out
    copies = m.replicas or 1  # None: a timeline.json from before copies
    if copies > 1:  # copies of the pipeline: a row per device of every copy
        labels = [f"copy {i // m.stages} stage {i % m.stages}  {d}" for i, d in enumerate(m.devices)]
    out.append(
        image(plots.gantt(measured_rows(m, step), labels, f"measured: step {step.step}", "ms"), "measured timeline")
    )
    out.append(
        f"<p>measured bubble fraction <b>{m.measured_bubble_fraction:.3f}</b> (idle time / all time over "
        f"the profiled steps {', '.join(str(s.step) for s in m.steps if s.complete)}), planned "
        f"{m.planned_bubble_fraction:.3f}; step {m.step_ms:.2f} ms from the first action to the last; "
        f"slowest stage: {m.slowest_stage}</p>"
    )
    rows = [
        (
            p.stage if copies == 1 else f"{p.stage} (copy {p.replica})",
            p.device,
            p.busy_ms,
            p.busy_fraction,
            p.forward_ms,
            p.backward_ms,
            p.copy_ms,
            p.copy_wait_ms,
            p.update_ms,
        )
        for p in m.per_stage
    ]
    out.append(
        table(
            (
                "stage",
                "device",
                "busy ms",
                "busy fraction",
                "forward ms",
                "backward ms",
                "copy ms",
                "copy wait ms",
                "update ms",
            ),
            rows,
            "measured",
        )
    )
    shared = (
        " These stages are logical CPU devices of one process, which share one thread pool: the trace "
        "shows order, not overlap."
        if m.shared_threads
        else ""
    )
    out.append(
        "<p class='note'>per step, mean over the profiled steps. copy: transfer ops inside the actions; "
        f"copy wait: idle time of a stage after its next input was ready on another device.{shared}</p>"
    )
    if m.advice:
        out.append(f"<p class='advice' id='advice'>{esc(m.advice.text)}</p>")
    return out


def memory_section(rec: RunRecord) -> str:
    stages = [s for s in rec.stages if isinstance(s.peak_memory_bytes, (int, float))]
    out = ["<h2>Memory and throughput</h2>"]
    if stages:
        out.append(
            image(
                plots.bars(
                    [f"stage {s.index}" for s in stages],
                    [s.peak_memory_bytes / 2**20 for s in stages],
                    f"peak memory per device ({rec.facts.peak_memory_scope})",
                    "MiB",
                ),
                "peak memory",
            )
        )
    replica = rec.mirrored.replica_peak_memory_bytes
    if replica:
        out.append(
            table(
                ("replica", "peak memory (MiB)"),
                [(d, mib(v)) for d, v in zip(rec.mirrored.replica_devices or [], replica)],
            )
        )
    f = rec.facts
    rows = [
        ("examples per second", f.examples_per_second),
        ("examples per step", f.examples_per_step),
        ("steps", f.steps),
        ("loss, first step", f.loss_first),
        ("loss, last step", f.loss_last),
    ]
    out.append(table(("", "value"), rows, "throughput"))
    return "\n".join(out)


def config_section(rec: RunRecord) -> str:
    overrides = " ".join(rec.overrides) or "(none)"
    return (
        f"<h2>Config</h2><p>overrides: <code>{esc(overrides)}</code></p>"
        f"<pre id='config'>{esc(rec.config or '(no .hydra/config.yaml)')}</pre>"
    )


def single(rec: RunRecord) -> str:
    """The page of one run."""
    f = rec.facts
    facts = [f"mode {known(f.mode)}", f"strategy {known(f.strategy)}", f"{known(f.steps)} steps"]
    if f.resumed_from is not None:
        facts.append(f"resumed from step {f.resumed_from}")
    if rec.summary is None:
        facts.append("no summary.json (the run did not finish)")
    body = [
        f"<h1>chain run {esc(rec.name)}</h1>",
        f"<p>{esc(rec.path)}: {esc(', '.join(facts))}</p>",
        curve_section(rec),
        placement_section(rec),
        plan_section(rec),
        timeline_section(rec),
        memory_section(rec),
        config_section(rec),
    ]
    return document(f"chain run {rec.name}", body)


# --- several runs ------------------------------------------------------------------------------


def known(value) -> str:
    """A summary's value for the page's first line: `?` when the summary lacks it."""
    return "?" if value is None else str(value)


def final(series) -> float | None:
    return series[-1][1] if series else None


def labels(records: Sequence[RunRecord]) -> list[str]:
    """Each run's name in legends and tables: its directory's name, or its path where names repeat."""
    names = [r.name for r in records]
    return [r.name if names.count(r.name) == 1 else r.path for r in records]


def comparison(records: Sequence[RunRecord]) -> str:
    """The page comparing runs: final metrics side by side, curves overlaid."""
    names = labels(records)
    tags = sorted({t for r in records for t in r.curves.get("chain", {})})
    header = [
        "run",
        "mode",
        "schedule",
        "microbatches",
        "steps",
        "loss first",
        "loss last",
        "examples/s",
        "bubble planned",
        "bubble measured",
        *[f"{t} (last)" for t in tags],
    ]
    rows = [
        (
            name,
            r.facts.mode,
            r.pipeline.schedule,
            r.pipeline.microbatches,
            r.facts.steps,
            r.facts.loss_first,
            r.facts.loss_last,
            r.facts.examples_per_second,
            r.pipeline.bubble_fraction,
            r.profile.measured_bubble_fraction,
            *[final(r.curves.get("chain", {}).get(t)) for t in tags],
        )
        for name, r in zip(names, records)
    ]
    body = [
        f"<h1>chain: {len(records)} runs compared</h1>",
        "<ul>"
        + "".join(
            f"<li>{esc(name)}: {esc(r.path)} <code>{esc(' '.join(r.overrides))}</code></li>"
            for name, r in zip(names, records)
        )
        + "</ul>",
        "<h2>Final metrics</h2>",
        table(header, rows, "metrics"),
        "<h2>Curves</h2>",
        image(
            plots.curves({n: r.curves.get("chain", {}) for n, r in zip(names, records)}, "the chain (tb/chain)"),
            "chain curves",
        ),
    ]
    n_stages = max((len(r.stage_writers()) for r in records), default=0)
    for k in range(n_stages):
        series = {n: r.curves.get(f"stage_{k:02d}", {}) for n, r in zip(names, records) if k < len(r.stage_writers())}
        if any(series.values()):
            body.append(f'<h3 id="curves-stage-{k}">stage {k}</h3>')
            body.append(image(plots.curves(series, f"stage {k}"), f"stage {k} curves"))
    return document("chain runs compared", body)


def document(title: str, body: Sequence[str]) -> str:
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
