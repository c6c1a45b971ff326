"""Device planning: from the machine's inventory and the config to a placement.

`plan` is a pure function of an `Inventory` (so it can be tested for machines we do
not have); `configure` applies a plan's logical-device split to TensorFlow, which must
happen before the runtime starts; `check_devices` validates device strings against the
devices that exist afterwards (soft placement would silently run a missing device's
work on CPU:0). Nothing outside this module discovers or splits devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from chain.errors import DeviceError


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the planner sees it."""

    index: int
    memory_mb: int | None = None
    name: str = ""


@dataclass(frozen=True)
class Inventory:
    """The physical devices of a machine: how many GPUs (and their memory)."""

    gpus: tuple[Gpu, ...] = ()


@dataclass
class Placement:
    """The planner's decision.

    `devices[k]` is stage k's device (canonical `/device:GPU:1` form). `kind` is the
    device type the stages run on; `split[p]` is how many logical devices physical
    device p is cut into, with `memory_limits_mb[p]` their limits (GPUs only).
    `strategy` is "pipeline" (a device per stage) or "mirrored" (data parallel).
    `physical[k]` names the physical device behind stage k's device.
    """

    devices: list[str]
    kind: str
    split: dict[int, int] = field(default_factory=dict)
    memory_limits_mb: dict[int, list[int] | None] = field(default_factory=dict)
    strategy: str = "pipeline"
    physical: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def canonical(device: str) -> str:
    """`/GPU:0`, `gpu:0`, `/job:localhost/.../device:GPU:0` -> `/device:GPU:0`."""
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(device if device.startswith("/") else "/" + device)
    except (ValueError, TypeError):
        raise DeviceError(f"{device!r} is not a device name; use e.g. /GPU:0 or /CPU:1") from None
    if spec.device_type is None:
        raise DeviceError(f"{device!r} names no device type; use e.g. /GPU:0 or /CPU:1")
    return f"/device:{spec.device_type.upper()}:{spec.device_index or 0}"


def _round_robin(n_stages: int, n_physical: int) -> list[int]:
    """Stage k -> physical device, spreading stages evenly and keeping neighbours together."""
    return [k * n_physical // n_stages for k in range(n_stages)]


def plan(pcfg: dict[str, Any], n_stages: int, inventory: Inventory) -> Placement:
    """Decide where every stage runs (see DESIGN.md, "Device rules").

    `pcfg` is the validated `placement` section. Pure: no TensorFlow calls.
    """
    gpus = inventory.gpus
    if pcfg.get("visible") is not None:
        have = [g.index for g in gpus]
        for i in pcfg["visible"]:
            if i not in have:
                raise DeviceError(f"placement.visible: GPU {i} does not exist; visible GPUs: {have or 'none'}")
        gpus = tuple(g for g in gpus if g.index in pcfg["visible"])
    n_gpus = len(gpus)

    if not n_gpus:
        # Rule 4: no GPU. One logical CPU per stage exercises the same code path as a
        # split GPU; explicit devices must name some of these.
        wanted = n_stages
        split = {0: wanted}
        devices = pcfg.get("devices") or [f"/device:CPU:{k}" for k in range(n_stages)]
        return Placement(devices=list(devices), kind="CPU", split=split, physical=["CPU:0"] * n_stages,
                         notes=[f"no GPU: CPU split into {wanted} logical devices"])

    if pcfg.get("devices"):
        # Rule 1: the user's mapping; one logical device per physical GPU unless more are named.
        per_gpu = max(1, -(-(_highest_index(pcfg["devices"], "GPU") + 1) // n_gpus))
        split = {g.index: per_gpu for g in gpus} if per_gpu > 1 else {}
        return Placement(devices=list(pcfg["devices"]), kind="GPU", split=split,
                         memory_limits_mb=_limits(pcfg, gpus, split), physical=[])

    if n_gpus >= n_stages:
        # Rule 2: stage k on GPU k.
        return Placement(devices=[f"/device:GPU:{k}" for k in range(n_stages)], kind="GPU",
                         physical=[f"GPU:{g.index}" for g in gpus[:n_stages]])

    # Rule 3: fewer GPUs than stages.
    fallback = pcfg.get("fallback", "virtual")
    if fallback == "error":
        raise DeviceError(
            f"placement.fallback=error: {n_stages} stages need {n_stages} GPUs, {n_gpus} found; "
            "use placement.fallback=virtual (split the GPUs) or mirrored (data parallel)"
        )
    if fallback == "mirrored":
        return Placement(devices=[f"/device:GPU:{i}" for i in range(n_gpus)], kind="GPU", strategy="mirrored",
                         physical=[f"GPU:{g.index}" for g in gpus],
                         notes=[f"{n_gpus} GPU(s) < {n_stages} stages: whole chain replicated (MirroredStrategy)"])
    owner = _round_robin(n_stages, n_gpus)
    split = {gpus[p].index: owner.count(p) for p in range(n_gpus)}
    return Placement(devices=[f"/device:GPU:{k}" for k in range(n_stages)], kind="GPU", split=split,
                     memory_limits_mb=_limits(pcfg, gpus, split),
                     physical=[f"GPU:{gpus[p].index}" for p in owner],
                     notes=[f"{n_gpus} GPU(s) < {n_stages} stages: GPUs split into {n_stages} logical GPUs"])


def _highest_index(devices: Sequence[str] | None, kind: str) -> int:
    best = -1
    for d in devices or ():
        head, _, idx = d.upper().rpartition(":")
        if head.endswith(kind) and idx.isdigit():
            best = max(best, int(idx))
    return best


def _limits(pcfg: dict[str, Any], gpus: Sequence[Gpu], split: dict[int, int]) -> dict[int, list[int] | None]:
    """Memory limit of each logical GPU, per physical GPU (None: no limit known)."""
    limits: dict[int, list[int] | None] = {}
    given = pcfg.get("memory_limit_mb")
    n_logical = sum(split.values())
    if isinstance(given, list) and len(given) != n_logical:
        raise DeviceError(f"placement.memory_limit_mb has {len(given)} entries; give one number or {n_logical} (one per stage)")
    start = 0
    for g in gpus:
        n = split.get(g.index, 0)
        if not n:
            continue
        if isinstance(given, list):
            mine = given[start : start + n]
        elif given is not None:
            mine = [given] * n
        elif g.memory_mb:
            free = g.memory_mb - pcfg.get("reserve_mb", 0)
            if free <= 0:
                raise DeviceError(f"placement.reserve_mb={pcfg.get('reserve_mb')} leaves no memory on GPU {g.index} ({g.memory_mb} MB)")
            mine = [free // n] * n
        else:
            mine = None
        if mine is not None and g.memory_mb and sum(mine) > g.memory_mb:
            raise DeviceError(
                f"placement.memory_limit_mb: limits on GPU {g.index} add up to {sum(mine)} MB, more than its {g.memory_mb} MB"
            )
        limits[g.index] = mine
        start += n
    return limits


def discover() -> Inventory:
    """The physical GPUs TensorFlow sees (after CUDA_VISIBLE_DEVICES), with their memory if known."""
    import tensorflow as tf

    gpus = []
    for i, dev in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(dev) if hasattr(tf.config.experimental, "get_device_details") else {}
        gpus.append(Gpu(index=i, memory_mb=None, name=details.get("device_name", "")))
    return Inventory(gpus=tuple(gpus))


def configure(placement: Placement, pcfg: dict[str, Any]) -> None:
    """Apply the plan's logical-device split. Must run before the first tensor exists.

    If the runtime already started (a notebook, or the test session that split the CPU
    in conftest.py), the existing logical devices are used as they are and
    `check_devices` reports any device the plan needs that is missing.
    """
    import tensorflow as tf

    if pcfg.get("log_device_placement"):
        tf.debugging.set_log_device_placement(True)
    physical = tf.config.list_physical_devices(placement.kind)
    try:
        if placement.kind == "GPU" and pcfg.get("visible") is not None:
            tf.config.set_visible_devices([physical[i] for i in pcfg["visible"]], "GPU")
        for index, n in placement.split.items():
            dev = physical[index]
            if placement.kind == "CPU":
                tf.config.set_logical_device_configuration(dev, [tf.config.LogicalDeviceConfiguration()] * n)
            else:
                limits = placement.memory_limits_mb.get(index) or [None] * n
                tf.config.set_logical_device_configuration(
                    dev, [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits]
                )
        if placement.kind == "GPU" and pcfg.get("memory_growth") and not placement.split:
            for dev in physical:
                tf.config.experimental.set_memory_growth(dev, True)
    except RuntimeError:
        pass  # runtime already initialised: keep the logical devices it has


def check_devices(devices: Sequence[str], given: bool = True) -> list[str]:
    """Canonical names of `devices`, or a DeviceError naming the first that does not exist.

    `given`: the devices come from `placement.devices` (the error names that key).
    """
    import tensorflow as tf

    existing = [canonical(d.name) for d in tf.config.list_logical_devices()]
    out = []
    for k, d in enumerate(devices):
        where = f"placement.devices[{k}]={d!r}" if given else f"stage {k} needs {d}, which"
        try:
            c = canonical(d)
        except DeviceError as e:
            raise DeviceError(f"placement.devices[{k}]: {e}") from None
        if c not in existing:
            raise DeviceError(f"{where} does not exist; available: {', '.join(existing)}")
        out.append(c)
    return out
