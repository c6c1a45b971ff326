"""Fault injection FOR TESTS ONLY: environment variables that kill or stall a run on purpose.

They exist so tests can prove crash safety with a real `kill -9`; nothing else should
set them. Unset (the normal case), every hook is a no-op.

    CHAIN_TEST_KILL_AT_STEP=k    after step k (and its checkpoint, if one is due) the
                                 process sends itself SIGKILL: no cleanup, no flush.
    CHAIN_TEST_ANNOUNCE=1        print `test-hook: step N done` to stderr after each step,
                                 so a test can time a kill from the first step on.
    CHAIN_TEST_OOM=STEP[@DEVICE]  (mode=side_by_side) the first try of step STEP (counted
                                 in this process) raises ResourceExhaustedError naming
                                 DEVICE (default /device:CPU:0), as a device out of memory.
    CHAIN_TEST_SAVE_PAUSE=SEC[@STEP]
                                 after each part (stage_NN/, then data/) of a save (of
                                 step STEP only, if given), print `test-hook: saved PART
                                 of step N` to stderr and sleep SEC seconds: a slow save
                                 that a test can SIGKILL half-way, with no timing race.
    CHAIN_TEST_FAIL_SAVE=STEP[@PART]
                                 the save of step STEP fails with "No space left on
                                 device" (OSError ENOSPC) just before writing PART
                                 (default: data, after every stage was written), as a
                                 full disk would.
    CHAIN_TEST_HOLD=SCOPE@STEP[,SEC]
                                 (mode=e2e) the action whose ops carry the name scope SCOPE
                                 (`Action.scope`, e.g. s1_F2: stage 1's forward of
                                 microbatch 2) waits SEC seconds (default: an hour) before
                                 it starts, in the STEP-th step this process runs: a stalled
                                 step, for trainer.stall_s. The wait is a host op the
                                 action depends on (it runs on the client in a cluster).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

KILL_AT_STEP = "CHAIN_TEST_KILL_AT_STEP"
ANNOUNCE = "CHAIN_TEST_ANNOUNCE"
SAVE_PAUSE = "CHAIN_TEST_SAVE_PAUSE"
FAIL_SAVE = "CHAIN_TEST_FAIL_SAVE"
OOM = "CHAIN_TEST_OOM"
HOLD = "CHAIN_TEST_HOLD"
_oom_raised: set[int] = set()


def after_step(step: int) -> None:
    """Announce the step (`CHAIN_TEST_ANNOUNCE`); die like a preempted job if `CHAIN_TEST_KILL_AT_STEP` names it."""
    if os.environ.get(ANNOUNCE):
        print(f"test-hook: step {step} done", file=sys.stderr, flush=True)
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


def before_part_saved(step: int, part: str) -> None:
    """Fail like a full disk before writing `part` of `step`, if `CHAIN_TEST_FAIL_SAVE` says so."""
    value = os.environ.get(FAIL_SAVE)
    if not value:
        return
    at, _, where = value.partition("@")
    if int(at) == step and part == (where or "data"):
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAIL_SAVE})")


def before_step(step: int) -> None:
    """Run out of memory like a device would, once, if `CHAIN_TEST_OOM` names this step."""
    value = os.environ.get(OOM)
    if not value:
        return
    at, _, device = value.partition("@")
    if int(at) == step and step not in _oom_raised:
        _oom_raised.add(step)
        import tensorflow as tf

        raise tf.errors.ResourceExhaustedError(
            None,
            None,
            f"OOM when allocating tensor with shape[64,256] and type float on "
            f"{device or '/device:CPU:0'} by allocator (injected by {OOM})",
        )


def hold(scope: str, after: list, device: str):
    """While the step is traced: for the action named `scope`, if `CHAIN_TEST_HOLD` names it, an op
    on `device` that runs after `after` and waits there in the step it names (the action's ops are
    made to wait for it); else None."""
    value = os.environ.get(HOLD)
    if not value:
        return None
    name, _, rest = value.partition("@")
    at, _, seconds = rest.partition(",")
    if name != scope:
        return None
    import numpy as np
    import tensorflow as tf

    runs = [0]

    def wait() -> np.ndarray:
        runs[0] += 1
        if runs[0] == int(at):
            print(f"test-hook: holding {scope} in step {runs[0]}", file=sys.stderr, flush=True)
            time.sleep(float(seconds or 3600))
        return np.int32(0)

    with tf.device(device), tf.control_dependencies(after):
        return tf.py_function(wait, [], tf.int32, name=f"hold_{scope}").op
