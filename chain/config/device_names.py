"""Device names, parsed without TensorFlow (`canonical`): the config checks `placement.devices`'
syntax with it, and the planner and the steps compare devices by their canonical names.

A leaf of `chain.config` (it imports only `chain.errors`), so that the config never imports
the planner: `chain.planning.devices` applies a plan to TensorFlow and re-exports these names.
"""

from __future__ import annotations

import re

from chain.errors import DeviceError

LOCAL_JOB = "localhost"
WORKER_JOB = "worker"  # the job of `python -m chain.worker` processes
_PART = re.compile(r"^(job|replica|task|device):(.+)$", re.IGNORECASE)
_TYPED = re.compile(r"^([A-Za-z_]+):(\d+)$")


def canonical(device: str) -> str:
    """`/GPU:0`, `gpu:0`, `/job:localhost/replica:0/task:0/device:GPU:0` -> `/device:GPU:0`.

    A device of another job keeps its job, replica and task:
    `/job:worker/task:1/CPU:0` -> `/job:worker/replica:0/task:1/device:CPU:0`; a task
    without a job is a cluster worker's: `/task:1/GPU:0` -> `/job:worker/replica:0/task:1/device:GPU:0`.
    Pure string parsing: TensorFlow's own parser accepts the same forms.
    """
    if not isinstance(device, str) or not device.strip("/"):
        raise DeviceError(f"{device!r} is not a device name; use e.g. /GPU:0 or /CPU:1")
    job, replica, task, kind, index = None, 0, 0, None, 0
    for part in device.strip("/").split("/"):
        typed, named = _TYPED.match(part), _PART.match(part)
        try:
            if named and named.group(1).lower() == "device":
                inner = _TYPED.match(named.group(2))
                if not inner:
                    raise ValueError
                kind, index = inner.group(1), int(inner.group(2))
            elif named and named.group(1).lower() == "job":
                job = named.group(2)
            elif named:
                value = int(named.group(2))
                replica, task = (value, task) if named.group(1).lower() == "replica" else (replica, value)
            elif typed:
                kind, index = typed.group(1), int(typed.group(2))
            else:
                raise ValueError
        except ValueError:
            raise DeviceError(f"{device!r} is not a device name; use e.g. /GPU:0 or /CPU:1") from None
    if kind is None:
        raise DeviceError(f"{device!r} names no device type; use e.g. /GPU:0 or /CPU:1")
    short = f"/device:{kind.upper()}:{index}"
    if job is None and ("task:" in device.lower() or "replica:" in device.lower()):
        job = WORKER_JOB  # the short form of a cluster worker's device: /task:1/GPU:0
    if job is None or (job == LOCAL_JOB and replica == 0 and task == 0):
        return short
    return f"/job:{job}/replica:{replica}/task:{task}{short}"
