"""`trainer.profile=[START, STOP]`: trace those steps with TensorFlow's profiler, then write the
measured timeline (`timeline.json`), print it next to the plan and say which stage holds
the pipeline back.

The fit loop asks its cadences (`chain.training.cadence.Span`) how many steps its next call
may run (calls end where the window starts, and inside it every step is a call of its own, so each step has its own
interval in the trace), and runs each call inside `Window.call`. The first step of the
window starts the profiler, the last one stops it and `chain.pipeline.timeline` reads the
trace. The trace stays under `RUN_DIR/tb/chain/plugins/profile/`, beside the chain's
TensorBoard events, where TensorBoard's profile plugin (when installed) shows it.

In one process the client's profiler sees every op. In a cluster the ops run in the workers:
each must serve TensorFlow's profiler (`python -m chain.worker --profile-port P`), and the
run names those ports in `cluster.profile_ports`, in task order. Before the run writes anything
each must answer and be idle (one line naming the port, exit 2); the window's first step starts a
trace session on every worker and waits until each runs, the last one ends them
(`chain.training.worker_trace`), so the workers' traces hold the whole window however long its
steps take; the client traces itself for the step markers. A step that some worker's trace
does not hold from start to end is not measured (`timeline.measure`), and a warning says which.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from dataclasses import replace
from typing import Any

from chain.records.measured import Advice, MeasuredTimeline
from chain.records.serial import RecordError, from_json, to_json
from chain.records.summaries import ProfileFields, StageTimes, Summary

from chain.config.checks import profile_ports
from chain.config.schema import Builder, KerasModel, StageSpec, plain
from chain.errors import ChainError, ConfigError
from chain.pipeline import measured_grid, timeline
from chain.state.atomic import write_json, writing

log = logging.getLogger("chain")

TIMELINE = "timeline.json"
CUT_LABEL = re.compile(r" layers \d+-\d+ \(")  # chain.stages.cut.describe: "model.keras layers 0-3 (d1..d4)"


def worker_task(device: str) -> int | None:
    """The task of a `/job:worker/replica:0/task:T/...` device (None: not a cluster worker's)."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    return spec.task if spec.job == "worker" else None


def _cut_model(stages) -> bool:
    """One Keras model cut into these stages (model=keras, or chain.build(cfg, model=...)): they carry
    chain.stages.cut's labels."""
    return any(s.spec is not None and isinstance(s.spec.model, KerasModel) for s in stages) or all(
        s.label and CUT_LABEL.search(s.label) for s in stages
    )


def _own_bodies(stages) -> bool:
    """Every stage is the chain's own mlp/conv body (its layers set by `model.depth`)."""
    return all(
        s.label is None and s.spec is not None and not isinstance(s.spec.model, (Builder, KerasModel)) for s in stages
    )


def layer_kinds(stages) -> list[StageSpec] | None:
    """What one movable layer of each stage is, for `timeline.advise`: for the chain's own bodies,
    the stage's spec but for its depth (width, activation, dropout, optimizer, target: a layer
    moved to a stage that differs in any of them would become another layer); None when any layer
    may go to any stage (one cut Keras model: the split moves its cut points, never its layers)."""
    if _cut_model(stages) or not _own_bodies(stages):
        return None
    return [_kind(s.spec) for s in stages]


def layer_shares(stages) -> list[list[float]] | None:
    """One cut Keras model's layers weighed by their parameters, for `timeline.advise` (an embedding and
    an `Add` are not a transformer block); None for the chain's own bodies, whose layers of a stage are alike."""
    if not _cut_model(stages):
        return None
    return [
        [float(layer.count_params()) for layer in s.model.layers if type(layer).__name__ != "InputLayer"]
        for s in stages
    ]


def _kind(spec: StageSpec) -> StageSpec:
    return replace(spec, model=replace(spec.model, depth=1))


def _flow(value: Any) -> str:
    """A value in Hydra's override syntax (flow style): {a: 1, b: relu}."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, str) and not re.fullmatch(r"[A-Za-z_][\w.-]*", value):
        return json.dumps(value)
    return str(value)


def _stage_entry(kind: StageSpec, depth: int, template: StageSpec | None) -> str:
    """One `+stages=[...]` entry building a stage of `kind` with `depth` layers: what differs from the
    `stage` template (a group whose name differs: the whole group), then the depth."""
    mine, base = plain(kind), plain(template or kind)
    entry: dict[str, Any] = {}
    for group in ("model", "optim"):
        whole = mine[group].get("name") != base[group].get("name")  # e.g. a conv stage under an mlp template
        entry[group] = {k: v for k, v in mine[group].items() if k != "depth" and (whole or v != base[group].get(k))}
    entry["model"]["depth"] = depth
    if not entry["optim"]:
        del entry["optim"]
    if mine["target"] != base["target"]:
        entry["target"] = mine["target"]
    return _flow(entry)


def layers_and_override(
    stages, split: list[int] | None, template: StageSpec | None = None
) -> tuple[list[int], str | None]:
    """Each stage's layers, counted in the unit a config can move, and the override that sets
    layers per stage to `split`: `placement.split` for one cut Keras model, `+stages=[...]` for
    the chain's own bodies (each new stage the spec of the layers it holds, written against the
    `stage` template; None: the stages differ from it only in depth), none for a user's builders.
    A split of the chain's own bodies must keep every stage's layers of one kind (`layer_kinds`)."""
    if _cut_model(stages):
        layers = [len([layer for layer in s.model.layers if type(layer).__name__ != "InputLayer"]) for s in stages]
        return layers, (f"placement.split=[{','.join(map(str, split))}]" if split else None)
    if _own_bodies(stages):
        layers = [s.spec.model.depth for s in stages]
        if not split:
            return layers, None
        each = [_kind(s.spec) for s in stages for _ in range(s.spec.model.depth)]  # one per layer, in order
        if template is None and any(k != each[0] for k in each):
            raise ValueError("stages that differ in more than depth need the `stage` template to write the override")
        entries, start = [], 0
        for d in split:
            if any(k != each[start] for k in each[start : start + d]):
                raise ValueError(f"split {split} puts layers of different kinds in one stage")
            entries.append(_stage_entry(each[start], d, template))
            start += d
        return layers, f"'+stages=[{','.join(entries)}]'"
    return [len(s.model.layers) for s in stages], None


class Window:
    """The profiled steps of one run and what their trace measured (`result`)."""

    def __init__(self, run: Any, start: int, stop: int):
        if run.schedule is None or any(s.device is None for s in run.stages):
            raise ConfigError(
                "trainer.profile measures a pipeline schedule: it needs mode=e2e with a device per "
                "stage (this run has no schedule, or is mirrored)"
            )
        if not run.run_dir:
            raise ConfigError("trainer.profile needs a run directory: build the run with chain.build(cfg, run_dir=...)")
        self.run, self.start, self.stop = run, start, stop
        self.logdir = os.path.join(run.run_dir, "tb", "chain")
        self.remote = self._remote_addresses()
        self.active, self.result = False, None
        self._before: set[str] = set()
        self._compiled: list[int] = []  # the window's steps whose call traced the step function first
        self._workers = None  # the workers' profilers (chain.training.worker_trace.WorkerTraces)
        if self.remote:
            from chain.training.worker_trace import WorkerTraces

            self._workers = WorkerTraces(
                self.remote, [f"cluster.profile_ports[{i}]={a.rsplit(':', 1)[1]}" for i, a in enumerate(self.remote)]
            )
            self._workers.check()  # before the run writes anything: a port that is no profiler is one line, exit 2

    def _remote_addresses(self) -> list[str]:
        """`host:port` of each worker's profiler, in task order (empty: not a cluster run)."""
        workers = self.run.assignment.cluster
        if not workers:
            return []
        ports = self.run.settings.cluster.profile_ports
        profile_ports(workers, ports)  # workers from TF_CONFIG are known only now
        return [f"{a.rsplit(':', 1)[0]}:{p}" for a, p in zip(workers, ports)]

    @contextlib.contextmanager
    def call(self, first: int, n: int):
        """Around one call of `n` steps from step `first`: traced and marked inside the window."""
        if not self.start <= first <= self.stop:
            yield
            return
        import tensorflow as tf

        if not self.active:
            self._begin(first)
        traces = sum(self.run.strategy.traces.values())
        with tf.profiler.experimental.Trace(timeline.MARKER, step_num=first, _r=1):
            yield
        if sum(self.run.strategy.traces.values()) > traces:
            self._compiled.append(first)
        if first == self.stop:
            self._end()

    def _begin(self, first: int) -> None:
        import tensorflow as tf

        with writing(f"the profile in {self.logdir}"):
            os.makedirs(self.logdir, exist_ok=True)
        self._before = set(timeline.trace_files(self.logdir))
        if self._workers is not None:  # returns once every worker traces: they hold the first step from its start
            self._workers.start(time.strftime("%Y_%m_%d_%H_%M_%S"), timeline.profile_root(self.logdir))
        tf.profiler.experimental.start(self.logdir)
        self.active = True
        log.info("profiling steps %d-%d (trace in %s)", first, self.stop, self.logdir)

    def _stop(self) -> None:
        import tensorflow as tf

        if self.active:
            self.active = False
            try:
                tf.profiler.experimental.stop()
            finally:  # the workers' sessions end with the client's, however that ends
                for problem in self._workers.stop() if self._workers is not None else ():
                    log.warning("profile: %s", problem)

    def close(self) -> None:
        """Stop a trace the run left unfinished (it stopped inside the window)."""
        with contextlib.suppress(Exception):
            self._stop()
        if self._workers is not None:
            self._workers.close()

    def devices(self) -> list[str]:
        """Every stage's device, of every copy of the pipeline (`placement.copies`): copy 0's stages first."""
        copies = self.run.assignment.copies
        return [d for row in copies for d in row] if copies else [s.device for s in self.run.stages]

    def sources(self) -> list[str | None]:
        """Per stage (of every copy), the trace file (host) whose events are its device's: its worker's in
        a cluster."""
        if not self.remote:
            return [None] * len(self.devices())
        out = []
        for device in self.devices():
            task = worker_task(device)
            out.append(self.remote[task].replace(":", "_") if task is not None and task < len(self.remote) else None)
        return out

    def shared_threads(self) -> bool:
        """Whether the stages are logical CPU devices of this process (one thread pool for all)."""
        return not self.remote and all("CPU" in d.upper() for d in self.devices())

    def _end(self) -> None:
        self._stop()
        files = [f for f in timeline.trace_files(self.logdir) if f not in self._before]
        events, steps = timeline.read_trace(files)
        run = self.run
        devices = self.devices()
        spans = timeline.trace_spans(files) if self.remote else None
        if spans is not None:
            self.warn_unheld(steps, spans)
        if self._compiled:
            log.warning(
                "profile: %s traced and compiled the step function in its call (the first one-step call): "
                "left out of the measured figures; start the window a step earlier to measure as many steps",
                ", ".join(f"step {n}" for n in self._compiled),
            )
        result = timeline.measure(
            run.schedule,
            events,
            steps,
            devices,
            self.sources(),
            run.settings.trainer.grad_accum,
            max(1, len(run.assignment.copies)),
            spans,
            self._compiled,
        )
        result.trace = sorted({os.path.relpath(os.path.dirname(f), run.run_dir) for f in files})
        result.advice = self.advice(result)
        result.shared_threads = self.shared_threads()
        with writing(os.path.join(run.run_dir, TIMELINE)):
            write_json(os.path.join(run.run_dir, TIMELINE), to_json(result))
        self.result = result
        plan = run.strategy.plan_text(full=True)
        note = (
            "\nnote: logical CPU devices of one process share its threads: the trace shows order, not overlap"
            if result.shared_threads
            else ""
        )
        log.info(
            "planned and measured timelines (%s):\n%s\n%s%s",
            TIMELINE,
            plan,
            measured_grid.render(result, run.schedule, devices, run.settings.trainer.jit_compile),
            note,
        )
        if result.advice:
            log.warning("balance: %s", result.advice.text)

    def warn_unheld(self, steps: dict[int, tuple[int, int]], spans: dict[str, tuple[int, int]]) -> None:
        """A warning per worker whose trace does not hold every profiled step (`timeline.measure` leaves
        those steps out): which steps, and what its trace holds."""
        used = set(self.sources())
        for i, address in enumerate(self.remote):
            source = address.replace(":", "_")
            if source not in used:
                continue
            unheld = [n for n, step in sorted(steps.items()) if not timeline.holds(spans, source, step)]
            steps_text = f"step{'s' if len(unheld) > 1 else ''} {', '.join(map(str, unheld))}"
            if unheld and source not in spans:
                log.warning("profile: worker %d (%s) wrote no trace: %s not measured", i, address, steps_text)
            elif unheld:
                log.warning(
                    "profile: the trace of worker %d (%s) began after or ended before %s (not held whole): "
                    "not measured",
                    i,
                    address,
                    steps_text,
                )

    def advice(self, result: MeasuredTimeline) -> Advice | None:
        """The balance advice from the measured busy times (None: balanced, or nothing measured)."""
        if not result.per_stage:
            return None
        stages = self.run.stages
        layers, _ = layers_and_override(stages, None)
        busy = [p.busy_ms for p in result.per_stage if not p.replica]  # copies run the same stages' work
        advice = timeline.advise(busy, layers, kinds=layer_kinds(stages), shares=layer_shares(stages))
        if advice:
            advice.override = layers_and_override(stages, advice.split, self.run.settings.stage)[1]
            if advice.split == advice.layers:
                advice.override = None
            advice.text = timeline.advice_text(advice, advice.override)
        return advice

    def add_to(self, summary: Summary) -> Summary:
        """`summary` with the measured fields of summary.json (from this run's trace, or the
        timeline.json that an earlier run of this directory wrote when a resumed run starts after
        the window)."""
        result = self.result
        path = os.path.join(self.run.run_dir, TIMELINE)
        if result is None and os.path.exists(path):
            with open(path) as f:
                try:
                    result = from_json(MeasuredTimeline, json.load(f))
                except (ValueError, RecordError) as e:
                    raise ChainError(f"{path} is not a timeline chain wrote ({e})") from None
        if result is None:
            return summary
        profile = ProfileFields(
            result.measured_bubble_fraction,
            [s.step for s in result.steps],
            result.slowest_stage,
            result.advice.text if result.advice else None,
        )
        stages = list(summary.stages)
        for k, measured in enumerate(result.per_stage[: len(stages)]):
            stages[k] = replace(
                stages[k],
                measured=StageTimes(
                    measured.busy_fraction,
                    measured.busy_ms,
                    measured.forward_ms,
                    measured.backward_ms,
                    measured.copy_ms,
                    measured.copy_wait_ms,
                    measured.update_ms,
                ),
            )
        return replace(summary, profile=profile, stages=stages)
