"""Fault injection FOR TESTS ONLY: environment variables that kill or stall a run on purpose.

They exist so tests can prove crash safety with a real `kill -9`; nothing else should
set them. Unset (the normal case), every hook is a no-op.

    CHAIN_TEST_KILL_AT_STEP=k    after step k (and its checkpoint, if one is due) the
                                 process sends itself SIGKILL: no cleanup, no flush.
    CHAIN_TEST_SAVE_PAUSE=SEC[@STEP]
                                 after each part (stage_NN/, then data/) of a save (of
                                 step STEP only, if given), print `test-hook: saved PART
                                 of step N` to stderr and sleep SEC seconds: a slow save
                                 that a test can SIGKILL half-way, with no timing race.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_AT_STEP = "CHAIN_TEST_KILL_AT_STEP"
SAVE_PAUSE = "CHAIN_TEST_SAVE_PAUSE"


def after_step(step: int) -> None:
    """Die like a preempted job if `CHAIN_TEST_KILL_AT_STEP` names this step."""
    if os.environ.get(KILL_AT_STEP) == str(step):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def after_part_saved(step: int, part: str) -> None:
    """Announce a finished part of a save and stall, if `CHAIN_TEST_SAVE_PAUSE` is set."""
    value = os.environ.get(SAVE_PAUSE)
    if not value:
        return
    seconds, _, only = value.partition("@")
    if only and int(only) != step:
        return
    print(f"test-hook: saved {part} of step {step}", file=sys.stderr, flush=True)
    time.sleep(float(seconds))
