"""`trainer.stall_s`: a thread that says where the running step waits when no step completed for that long.

The training thread is inside TensorFlow while a step runs and cannot say anything itself. The
watch (`StallWatch`, started by `Run.fit`) knows when each call of the compiled step began and
ended (`begin`, `end`) and, for a pipeline step, polls the host's count of steps begun
(`Strategy.steps_begun`), which shows each new step begin inside a call of several
(`trainer.steps_per_call`); its report reads the markers of how far each device has come
(`Strategy.position`: `chain.pipeline.progress`). When no step completed for `stall_s` seconds
it logs the schedule's grid with each device's last finished action and the one it waits in
(`Strategy.waiting`), once per stall, and with `trainer.stall_action=stop` ends the process with
one line and exit code 7 (`chain.errors.Stalled`).

The clock runs only during calls (an evaluation or a save between them is not a step). A call
whose function has not run before in this process traces and compiles it first, which is not a
stall: a pipeline step is watched from the moment its markers show a step begun, a step that
leaves no markers (mode=local, mirrored, side by side) not at all in such a call. A call of n
steps without markers is stalled after n x `stall_s` seconds (the host sees only the call end).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from chain.config.schema import Trainer
from chain.errors import Stalled

log = logging.getLogger("chain")


@dataclass
class _Call:
    """One call of the compiled step, as the watch follows it."""

    step: int  # its first step
    n: int  # steps in it
    at: float  # when it began (time.monotonic)
    fresh: bool  # its function has not run before in this process: tracing and compiling come first
    started: int | None  # the markers' count of steps begun when it began (None: no markers)
    seen: int | None = None  # the count the watch saw last
    moved: float | None = None  # when the watch saw a step begin in this call
    reported: float | None = None  # the stall (by its start) already reported


class StallWatch(threading.Thread):
    """Watches the calls of `strategy`'s step; `stop` says whether a stall ends the run (exit 7)
    after its report; `intact()` says what survives (the last complete checkpoint)."""

    def __init__(self, seconds: float, stop: bool, strategy: Any, intact: Callable[[], str]):
        super().__init__(daemon=True, name="chain-stall-watch")
        self.seconds, self.stop_run, self.strategy, self.intact = seconds, stop, strategy, intact
        self._lock = threading.Lock()
        self._call: _Call | None = None
        self._ran: set[bool] = set()  # which functions have run: the loop of several steps, one step
        self._stopped = threading.Event()

    def begin(self, step: int, n: int) -> None:
        """Before a call of `n` steps from `step` (the training thread)."""
        call = _Call(step, n, time.monotonic(), (n > 1) not in self._ran, self.strategy.steps_begun())
        call.seen = call.started
        with self._lock:
            self._call = call

    def end(self, n: int) -> None:
        """After the call of `n` steps returned."""
        self._ran.add(n > 1)
        with self._lock:
            self._call = None

    def stop(self) -> None:
        """End the watch (from any thread)."""
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.wait(min(0.25, self.seconds / 4)):
            with self._lock:
                call = self._call
            if call is None:
                continue
            begun = self.strategy.steps_begun() if call.started is not None else None
            now = time.monotonic()
            if begun is not None and begun != call.seen:
                call.seen, call.moved = begun, now
            if begun is not None:
                since, limit = (call.moved if call.moved is not None else None if call.fresh else call.at), self.seconds
            else:
                since, limit = (None if call.fresh else call.at), self.seconds * call.n
            if since is None or now - since < limit or call.reported == since:
                continue
            call.reported = since
            with self._lock:
                if self._call is not call or self._stopped.is_set():
                    continue  # the call ended meanwhile
            self._report(call, now - since)

    def _report(self, call: _Call, waited: float) -> None:
        """Log where the step waits (the markers read now: `Strategy.position`); with `stop`, end the
        process with one line."""
        position = self.strategy.position() if call.started is not None else None
        grid = position is not None and position.started != call.started
        if position is None:
            step = call.step
            where = [
                f"step {step} has not completed (a call of steps {step}..{step + call.n - 1}); this run's "
                "step has no schedule to show where it waits"
            ]
        elif not grid:
            step = call.step
            where = [
                f"step {step} has not begun: its batch has not come, or the step before has not finished its updates"
            ]
        else:
            step = call.step + position.started - call.started - 1
            where = self.strategy.waiting(position)
        then = (
            "stopping (trainer.stall_action=stop)" if self.stop_run else "still waiting (trainer.stall_action=report)"
        )
        log.warning(
            "no step completed for %.0f s (trainer.stall_s=%g): step %d waits; %s%s\n%s",
            waited,
            self.seconds,
            step,
            then,
            "; each device's last finished action and the one it waits in (>):" if grid else ":",
            "\n".join(where),
        )
        if self.stop_run:
            for handler in logging.getLogger().handlers + log.handlers:
                handler.flush()
            print(
                f"error: step {step} stalled: no step completed for {waited:.0f} s (trainer.stall_s="
                f"{self.seconds:g}, trainer.stall_action=stop); {self.intact()}",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            os._exit(Stalled.exit_code)  # the training thread is inside TensorFlow: nothing else ends it


def running_watch(trainer: Trainer, strategy: Any, intact: Callable[[], str]) -> StallWatch | None:
    """The running watch of `trainer.stall_s` over `strategy`'s step, or None when it is 0 (`Run.fit`
    starts it, and stops it when the loop ends)."""
    if not trainer.stall_s:
        return None
    watch = StallWatch(trainer.stall_s, trainer.stall_action == "stop", strategy, intact)
    watch.start()
    return watch
