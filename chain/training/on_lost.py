"""`cluster.on_lost=replan|wait`: a run that goes on when a cluster worker is lost.

TensorFlow's cluster and logical devices cannot be configured again inside one process, so
`python -m chain` becomes a supervisor: it runs the training in a fresh process of itself
(the same overrides, its run directory pinned) and, when that process ends because a worker
was lost (exit 5), starts another with `resume=true` from the last complete checkpoint:
`replan` on the workers that still answer (none: local devices), `wait` on the same workers
once the lost one answers again (probed every second, up to `cluster.on_lost_wait_s`). At most
as many times as there are workers, so it never loops. The fresh process learns the history
from an environment variable (`LostWorkers` as JSON) and logs the last event with the layout it
trains on (a run with `placement.plan=auto` plans again); summary.json keeps them all
(`lost_workers`). The failed process notes the step it had reached and its layout in the run
directory (`STEP_FILE`, written atomically), which the supervisor reads and removes. The
supervisor holds the run directory's lock throughout and hands it down to each process
(`chain.state.lock.handed_down`), so no other run can start in the directory between two of them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Sequence

from chain.config.hydra import override_key, quoted
from chain.config.schema import Settings
from chain.errors import ConfigError
from chain.planning import cluster
from chain.records.serial import from_json, to_json
from chain.records.summaries import LostWorker, LostWorkers
from chain.state import atomic, lock, manifest

HISTORY_ENV = "CHAIN_LOST_WORKERS"  # the supervised process: the losses so far, as LostWorkers JSON ("": none)
STEP_FILE = ".lost_step"
_LOST_LINE = re.compile(r"^error: cluster worker (\d+) \(")
log = logging.getLogger("chain")


def supervises(settings: Settings) -> bool:
    """Whether this `python -m chain` supervises its training (`cluster.on_lost` other than stop, in the
    process the user started); a ConfigError when the setting cannot be honoured."""
    c = settings.cluster
    if c.on_lost == "stop" or HISTORY_ENV in os.environ:
        return False
    if not c.workers:
        raise ConfigError(
            f"cluster.on_lost={c.on_lost} needs cluster.workers (under a scheduler or TF_CONFIG, the "
            f"scheduler restarts the job: use cluster.on_lost=stop)"
        )
    return True


def history(run=None) -> list[LostWorker] | None:
    """The workers lost so far, as the supervisor told this process (None: none, or not supervised); the
    last one's layout after it is `run`'s (this process's `Run`)."""
    raw = os.environ.get(HISTORY_ENV)
    events = from_json(LostWorkers, json.loads(raw), HISTORY_ENV).events if raw else None
    if events and run is not None:
        events[-1] = replace(events[-1], layout_after=layout(run))
    return events or None


def announce(run) -> None:
    """Log the loss this process was started after (the supervisor's last event), if any, with the layout
    `run` (this process's `Run`) trains on."""
    events = history(run)
    if events:
        log.warning(events[-1].line())


def layout(run) -> str:
    """What `run` (a built `Run`) trains on, in words (`2 stages 1f1b M=2`: `Layout.describe`)."""
    from chain.state.run_settings import built_layout

    return built_layout(run.settings, run.stages, 0).describe()


def noted(run_dir: str | None, run, text: str) -> str:
    """Note in `run_dir` the step a supervised `run` had reached as a worker was lost, when (the clock's
    time) and its layout; returns `text`."""
    if run_dir and HISTORY_ENV in os.environ:
        try:
            atomic.write_text(os.path.join(run_dir, STEP_FILE), f"{run.global_step} {time.time()} {layout(run)}")
        except OSError:  # the supervisor then counts from the checkpoint
            pass
    return text


def _lost_at(run_dir: str, saved: int, ended: float) -> tuple[int, float, str | None]:
    """The step the failed process noted, when, and its layout (the file removed once read), else `saved`,
    `ended` and None."""
    path = os.path.join(run_dir, STEP_FILE)
    try:
        with open(path) as f:
            step, when, words = f.read().split(" ", 2)
        os.remove(path)
        return int(step), float(when), words.strip()
    except (OSError, ValueError):
        return saved, ended, None


def _train(args: Sequence[str], events: list[LostWorker], run_dir: str) -> tuple[int, list[str]]:
    """Run `python -m chain ARGS` told `events`, holding this process's lock of `run_dir` too; its exit
    code and the lost-worker lines it printed on stderr, which are held back (the supervisor decides
    whether the run stops)."""
    inherited, fd = lock.handed_down(run_dir)
    env = dict(os.environ, **inherited, **{HISTORY_ENV: json.dumps(to_json(LostWorkers(events)))})
    child = subprocess.Popen(
        [sys.executable, "-m", "chain", *args], env=env, stderr=subprocess.PIPE, text=True, pass_fds=(fd,)
    )
    held: list[str] = []

    def forward() -> None:
        for line in child.stderr:
            if line.startswith(("error: cluster worker", "error: a cluster worker")):
                held.append(line.rstrip("\n"))
            else:
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C reaches the child too: it says where it stopped
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
    reader.join()
    return code, held


def _answering(addresses: Sequence[str]) -> list[bool]:
    """Whether each address answers as a TensorFlow server now (within a second)."""
    return [cluster.silence(a, timeout=1.0) is None for a in addresses]


def _stop(held: list[str], code: int, waited: float | None = None) -> int:
    """Print the failed process's lines (`waited`: the seconds a lost worker was waited for) and return `code`."""
    for line in held:
        more = f" (waited {waited:g} s for it to answer again: cluster.on_lost_wait_s)" if waited is not None else ""
        print(line + more, file=sys.stderr, flush=True)
    return code


def supervise(settings: Settings, overrides: Sequence[str], run_dir: str) -> int:
    """Train in fresh processes, going on after each lost worker as `cluster.on_lost` says; the exit code.
    This process holds the lock of `run_dir` (`chain.state.lock`) and hands it down to each of them, so
    no other run starts in it between two of them."""
    c = settings.cluster
    dropped = ("resume", "hydra.run.dir", "cluster.workers")
    kept = [o for o in overrides if override_key(o) not in dropped]
    kept.append(f"hydra.run.dir={quoted(run_dir, 'hydra.run.dir')}")
    workers, resume, events = list(c.workers or ()), settings.resume, []
    for _ in range(len(c.workers or ()) + 1):
        listed = f"[{','.join(workers)}]" if workers else "null"
        code, held = _train([*kept, f"cluster.workers={listed}", f"resume={str(resume).lower()}"], events, run_dir)
        if code != cluster.EXIT_LOST or len(events) == len(c.workers or ()) or not manifest.exists(run_dir):
            return _stop(held, code)
        ended, noticed = time.time(), time.monotonic()
        answers = _answering(workers)
        found = _LOST_LINE.match(held[0]) if held else None
        index = int(found.group(1)) if found else (answers.index(False) if False in answers else 0)
        if c.on_lost == "wait":
            while not all(answers) and time.monotonic() - noticed < c.on_lost_wait_s:
                time.sleep(1.0)
                answers = _answering(workers)
            if not all(answers):
                return _stop(held, code, waited=c.on_lost_wait_s)
        after = list(workers) if c.on_lost == "wait" else [a for a, ok in zip(workers, answers) if ok]
        saved = manifest.read(run_dir)["step"]
        step, when, was = _lost_at(run_dir, saved, ended)
        if events:  # the process that was lost trained on what the one before it was started on
            events[-1] = replace(events[-1], layout_after=was)
        action = "waited" if c.on_lost == "wait" else "replanned"
        lost_s = round(time.time() - when, 3)
        events.append(LostWorker(index, workers[index], step, saved, step - saved, action, workers, after, lost_s, was))
        workers, resume = after, True
    return code
