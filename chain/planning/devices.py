"""Device names, and applying a plan to TensorFlow.

`canonical` parses a device name without TensorFlow (it lives in `chain.config.device_names`,
which the config's checks use; re-exported here). `configure` applies a placement to
TensorFlow (before its runtime starts); when the runtime started first, `share_existing`
puts the stages on the devices that exist where the plan allows it; `check_devices` validates
device names against the devices that exist afterwards: soft placement would silently run a
missing device's work on CPU:0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from chain.config.device_names import LOCAL_JOB, WORKER_JOB, canonical
from chain.errors import DeviceError, plural
from chain.planning.planner import PIPELINE, Assignment

if TYPE_CHECKING:
    from chain.config.schema import PlacementSettings

__all__ = ["LOCAL_JOB", "WORKER_JOB", "canonical", "configure", "share_existing", "check_devices", "count"]

# What a missing device's error adds when TensorFlow's runtime started before `configure` could make it.
TOO_LATE = (
    "TensorFlow's runtime has started (an earlier chain.setup or chain.build, a tensor or a Keras model), and "
    "its devices cannot change in this process: call chain.setup(cfg, ...) with every config this process "
    "builds before making any model or tensor (docs/python-api.md), or restart it"
)


def count(assignment: Assignment) -> int:
    """How many distinct devices the plan uses (its stages', replicas' and copies' together)."""
    used = {*assignment.devices, *assignment.mirrored_devices, *(d for row in assignment.copies for d in row)}
    return len(used - {None})


def configure(assignment: Assignment, pcfg: PlacementSettings) -> tuple[bool, str | None]:
    """Apply the plan to TensorFlow. Must run before the first tensor exists. (False, ...) when it
    could not; the second item is a note for the run (None: nothing to say).

    If the runtime already started (a notebook after `chain.setup`, a model made first, or the test
    session that split the CPU in conftest.py), the existing logical devices are kept, a note says
    so; `share_existing` may put the stages on them, and `check_devices` reports any device the plan
    still needs that is missing (with `late`). A CPU
    already split into at least as many logical devices as the plan's is kept as it is too: a plan
    needing fewer never shrinks a split a larger one (or the user) asked for.
    """
    import tensorflow as tf

    if pcfg.log_device_placement:
        tf.debugging.set_log_device_placement(True)
    if assignment.cluster:
        return True, None  # the devices are the workers'; this machine configures none
    try:
        if assignment.kind == "CPU":
            cpu = tf.config.list_physical_devices("CPU")[0]
            split = tf.config.get_logical_device_configuration(cpu)
            if split and len(split) >= assignment.split[0]:
                return True, f"the CPU was already split into {len(split)} logical devices: kept"
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * assignment.split[0]
            )
            return True, None
        physical = tf.config.list_physical_devices("GPU")
        if assignment.visible is not None:
            tf.config.set_visible_devices([physical[i] for i in assignment.visible], "GPU")
        for index, limits in assignment.memory_limits_mb.items():
            tf.config.set_logical_device_configuration(
                physical[index], [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits]
            )
        if assignment.memory_growth:
            for i, dev in enumerate(physical):
                if assignment.visible is None or i in assignment.visible:
                    tf.config.experimental.set_memory_growth(dev, True)
        return True, None
    except RuntimeError:
        kept = ", ".join(canonical(d.name) for d in tf.config.list_logical_devices())
        return False, f"TensorFlow's runtime had already started: kept its logical devices ({kept})"


def share_existing(assignment: Assignment, pcfg: PlacementSettings) -> Assignment | None:
    """The placement with its stages on the logical devices that exist, for when TensorFlow's runtime
    started before `configure` could make the plan's (a notebook's Keras model made first): the plan's
    devices in order onto the existing ones in contiguous runs (neighbouring stages share; on a CPU
    with one device, all on /device:CPU:0), the split and limits that were not made dropped, and a note
    saying so and what `chain.setup` would have given. None when every planned device exists, or the
    assignment needs its devices: `placement.devices` named, `placement.memory_limit_mb` on a GPU, copies of
    the pipeline, mirrored replicas (`check_devices` then refuses in one line)."""
    import tensorflow as tf

    if assignment.topology != PIPELINE or assignment.cluster or pcfg.devices:
        return None
    if assignment.kind == "GPU" and pcfg.memory_limit_mb is not None:
        return None
    existing = [canonical(d.name) for d in tf.config.list_logical_devices(assignment.kind)]
    planned = list(dict.fromkeys(assignment.devices))  # distinct, in stage order (a schedule may share some already)
    if not existing or all(d in existing for d in planned):
        return None
    onto = {d: existing[i * len(existing) // len(planned)] for i, d in enumerate(planned)}
    devices = tuple(onto[d] for d in assignment.devices)
    used = list(dict.fromkeys(devices))
    physical = {}
    for old, new in onto.items():  # the physical device behind a planned device's first stage
        physical.setdefault(new, "CPU:0" if assignment.kind == "CPU" else assignment.physical.get(old, "-"))
    shares = (
        f"share {used[0]}"
        if len(used) == 1
        else f"share the {plural(len(used), 'device')} that exist, neighbouring stages together ({', '.join(used)})"
    )
    n = plural(len(devices), "stage")
    if assignment.kind == "CPU":
        made = plural(len(planned), "logical device")
        note = (
            f"TensorFlow's runtime had started before chain could split the CPU into {made} (a model or tensor "
            f"made first, or an earlier build): the {n} {shares} instead; chain.setup(cfg) first would have made "
            "them, and on a CPU they split nothing: logical CPU devices share one thread pool"
        )
    else:
        limits = "; ".join(f"GPU {i}: {', '.join(map(str, m))} MB" for i, m in assignment.memory_limits_mb.items())
        note = (
            f"TensorFlow's runtime had started before chain could make {plural(len(planned), 'logical GPU')} (a model "
            f"or tensor made first, or an earlier build): the {n} {shares} instead, with no memory limit between "
            "them; chain.setup(cfg) first would have made them"
            + (f", each with a memory limit ({limits})" if limits else "")
        )
    return replace(assignment, devices=devices, physical=physical, split={}, memory_limits_mb={}).noted(note)


def check_devices(
    devices: Sequence[str], given: bool = True, role: str = "stage", late: str | None = None
) -> list[str]:
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
