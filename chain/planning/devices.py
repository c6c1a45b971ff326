"""Device names, and applying a plan to TensorFlow.

`canonical` parses a device name without TensorFlow (it lives in `chain.config.device_names`,
which the config's checks use; re-exported here). `configure` applies a placement to
TensorFlow (before its runtime starts) and `check_devices` validates device names against
the devices that exist afterwards: soft placement would silently run a missing device's
work on CPU:0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from chain.config.device_names import LOCAL_JOB, WORKER_JOB, canonical
from chain.errors import DeviceError

if TYPE_CHECKING:
    from chain.config.schema import PlacementSettings
    from chain.planning.planner import Placement

__all__ = ["LOCAL_JOB", "WORKER_JOB", "canonical", "configure", "check_devices", "count"]

# What a missing device's error adds when TensorFlow's runtime started before `configure` could make it.
TOO_LATE = ("TensorFlow's runtime has started (an earlier chain.setup or chain.build, a tensor or a Keras model), and "
            "its devices cannot change in this process: call chain.setup(cfg, ...) with every config this process "
            "builds before making any model or tensor (docs/python-api.md), or restart it")


def count(placement: Placement) -> int:
    """How many distinct devices the plan uses (its stages', replicas' and copies' together)."""
    used = {*placement.devices, *placement.mirrored_devices, *(d for row in placement.copies for d in row)}
    return len(used - {None})


def configure(placement: Placement, pcfg: PlacementSettings) -> tuple[bool, str | None]:
    """Apply the plan to TensorFlow. Must run before the first tensor exists. (False, ...) when it
    could not; the second item is a note for the run (None: nothing to say).

    If the runtime already started (a notebook after `chain.setup`, a model made first, or the test
    session that split the CPU in conftest.py), the existing logical devices are kept, a note says
    so, and `check_devices` reports any device the plan needs that is missing (with `late`). A CPU
    already split into at least as many logical devices as the plan's is kept as it is too: a plan
    needing fewer never shrinks a split a larger one (or the user) asked for.
    """
    import tensorflow as tf

    if pcfg.log_device_placement:
        tf.debugging.set_log_device_placement(True)
    if placement.cluster:
        return True, None  # the devices are the workers'; this machine configures none
    try:
        if placement.kind == "CPU":
            cpu = tf.config.list_physical_devices("CPU")[0]
            split = tf.config.get_logical_device_configuration(cpu)
            if split and len(split) >= placement.split[0]:
                return True, f"the CPU was already split into {len(split)} logical devices: kept"
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * placement.split[0])
            return True, None
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
        return True, None
    except RuntimeError:
        kept = ", ".join(canonical(d.name) for d in tf.config.list_logical_devices())
        return False, f"TensorFlow's runtime had already started: kept its logical devices ({kept})"


def check_devices(devices: Sequence[str], given: bool = True, role: str = "stage", late: str | None = None) -> list[str]:
    """Canonical names of `devices`, or a DeviceError naming the first that does not exist.

    `given`: the devices come from `placement.devices` (the error names that key);
    otherwise the planner chose them for each `role` ("stage" or "replica"). `late`: the kind of
    device ("CPU", "GPU") `configure` would have made but could not, the runtime having started;
    a missing device of that kind gets `TOO_LATE`'s advice in its line.
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
            why = f"; {TOO_LATE}" if late and f"/device:{late}:" in c else ""
            raise DeviceError(f"{where} does not exist; available: {', '.join(existing)}{why}")
        out.append(c)
    return out
