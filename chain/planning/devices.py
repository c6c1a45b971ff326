"""Device names, and applying a plan to TensorFlow.

`canonical` parses a device name without TensorFlow. `configure` applies a placement to
TensorFlow (before its runtime starts) and `check_devices` validates device names against
the devices that exist afterwards: soft placement would silently run a missing device's
work on CPU:0.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from chain.errors import DeviceError

if TYPE_CHECKING:
    from chain.config.schema import PlacementSettings
    from chain.planning.planner import Placement

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


def configure(placement: Placement, pcfg: PlacementSettings) -> None:
    """Apply the plan to TensorFlow. Must run before the first tensor exists.

    If the runtime already started (a notebook, or the test session that split the CPU
    in conftest.py), the existing logical devices are kept, a note says so, and
    `check_devices` reports any device the plan needs that is missing.
    """
    import tensorflow as tf

    if pcfg.log_device_placement:
        tf.debugging.set_log_device_placement(True)
    if placement.cluster:
        return  # the devices are the workers'; this machine configures none
    try:
        if placement.kind == "CPU":
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * placement.split[0])
            return
        physical = tf.config.list_physical_devices("GPU")
        if placement.visible is not None:
            tf.config.set_visible_devices([physical[i] for i in placement.visible], "GPU")
        for index, limits in placement.memory_limits_mb.items():
            tf.config.set_logical_device_configuration(
                physical[index], [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits])
        if placement.memory_growth:
            for i, dev in enumerate(physical):
                if placement.visible is None or i in placement.visible:
                    tf.config.experimental.set_memory_growth(dev, True)
    except RuntimeError:
        kept = ", ".join(canonical(d.name) for d in tf.config.list_logical_devices())
        placement.notes.append(f"TensorFlow's runtime had already started: kept its logical devices ({kept})")


def check_devices(devices: Sequence[str], given: bool = True, role: str = "stage") -> list[str]:
    """Canonical names of `devices`, or a DeviceError naming the first that does not exist.

    `given`: the devices come from `placement.devices` (the error names that key);
    otherwise the planner chose them for each `role` ("stage" or "replica").
    """
    import tensorflow as tf

    existing = [canonical(d.name) for d in tf.config.list_logical_devices()]
    out = []
    for k, d in enumerate(devices):
        where = f"placement.devices[{k}]={d!r}" if given else f"{role} {k} needs {d}, which"
        try:
            c = canonical(d)
        except DeviceError as e:
            raise DeviceError(f"placement.devices[{k}]: {e}") from None
        if c not in existing:
            raise DeviceError(f"{where} does not exist; available: {', '.join(existing)}")
        out.append(c)
    return out
