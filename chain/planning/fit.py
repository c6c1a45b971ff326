"""Whether a plan fits: each stage's estimated peak (`chain.planning.footprint`) against its device's memory.

A logical GPU's memory is its limit (`placement.memory_limit_mb`, or its share of a split card),
a whole GPU's is its card's (nvidia-smi); stages sharing a device (interleaved) add up. A plan
over a known memory is refused before anything is built, in one line naming the stage, its
estimate, the device's memory and what would make it fit. Logical CPU devices share the host's
memory: `chain.planning.planner.check_memory` holds their sum to it; here they show no memory of
their own. Pure: no TensorFlow.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from chain.config.shapes import human
from chain.errors import DeviceError
from chain.planning.footprint import Footprint
from chain.planning.inventory import Inventory
from chain.planning.planner import MIRRORED, Assignment

MB = 1 << 20  # TensorFlow's memory limits are in MiB


def _logical_gpus(assignment: Assignment, inventory: Inventory) -> dict[str, tuple[int, int | None]]:
    """Each logical GPU of the plan (`/device:GPU:n`) -> (its card's index, its memory in MB: its
    limit, or its card's memory when the card is not split; None: unknown). Logical GPUs are
    numbered card after card over the visible cards (see `chain.planning.planner`)."""
    out: dict[str, tuple[int, int | None]] = {}
    for g in inventory.gpus:
        if assignment.visible is not None and g.index not in assignment.visible:
            continue
        limits = assignment.memory_limits_mb.get(g.index)
        for j in range(assignment.split.get(g.index, 1)):
            out[f"/device:GPU:{len(out)}"] = (g.index, limits[j] if limits else g.memory_mb)
    return out


def device_memory_mb(assignment: Assignment, inventory: Inventory) -> dict[str, int | None]:
    """Each logical GPU of the plan and its memory in MB (None: unknown)."""
    return {d: mb for d, (_, mb) in _logical_gpus(assignment, inventory).items()}


def stage_devices(assignment: Assignment, n_stages: int) -> list[list[str]]:
    """Per stage, the devices that hold a copy of it (copies of the pipeline: one per copy); [] when
    mirrored (every replica holds the whole chain) or on cluster workers (their memory is theirs)."""
    if assignment.topology == MIRRORED or assignment.cluster:
        return [[] for _ in range(n_stages)]
    rows = assignment.copies or [assignment.devices]
    return [[row[k] for row in rows if row[k] is not None] for k in range(n_stages)]


def _on_device(assignment: Assignment, footprints: Sequence[Footprint | None]) -> dict[str, list[int]]:
    """Each device and the stages it holds."""
    out: dict[str, list[int]] = {}
    for k, devices in enumerate(stage_devices(assignment, len(footprints))):
        for d in devices:
            out.setdefault(d, []).append(k)
    return out


def _parts(f: Footprint) -> str:
    return (
        f"weights {human(f.weights)}, gradients {human(f.gradients)}, optimizer {human(f.optimizer)}, "
        f"activations {human(f.activations)} ({f.held} microbatch{'es' if f.held != 1 else ''} held), "
        f"inputs {human(f.inputs)}"
    )


def check_stages_fit(
    assignment: Assignment,
    footprints: Sequence[Footprint | None],
    inventory: Inventory,
    alternatives: Callable[[], Mapping[str, Sequence[Footprint | None]]] | None = None,
) -> None:
    """Refuse a plan in which a device with a known memory holds stages estimated above it: one
    DeviceError line naming the stage, its estimate, the device's memory and what would make it fit.

    `alternatives()` maps a change of settings (`pipeline.recompute=always`) to the footprints it
    would give (asked only when refusing); those under the device's memory are offered. Stages of
    unknown cost (None) count 0.
    """
    memory = device_memory_mb(assignment, inventory)
    for device, stages in _on_device(assignment, footprints).items():
        limit = memory.get(device)
        known = [k for k in stages if footprints[k] is not None]
        if limit is None or not known:
            continue
        total = sum(footprints[k].total for k in known)
        if total <= limit * MB:
            continue
        k = max(known, key=lambda j: footprints[j].total)
        f = footprints[k]
        fits, tried = [], alternatives() if alternatives else {}
        for change, others in tried.items():
            if all(others[j] is not None for j in known):
                theirs = sum(others[j].total for j in known)
                if theirs <= limit * MB:
                    fits.append(f"{change} (about {human(theirs)})")
        if fits:
            advice = "it would fit with " + " or ".join(fits) + "; "
        elif tried:
            advice = f"neither {' nor '.join(tried)} brings it under; "
        else:
            advice = ""
        what = (
            f"stage {k} needs about {human(f.total)} on {device} ({_parts(f)})"
            if len(known) == 1
            else f"stages {', '.join(map(str, known))} need about {human(total)} together on {device} (the largest, "
            f"stage {k}, {human(f.total)}: {_parts(f)})"
        )
        raise DeviceError(
            f"{what}, more than its {human(limit * MB)} "
            f"({_source(assignment, device, inventory, limit)}); {advice}or split the model differently (placement.split, "
            "placement.balance=memory, more stages), or use a smaller model or data.batch_size"
        )


def _source(assignment: Assignment, device: str, inventory: Inventory, limit: int) -> str:
    """Where a device's memory figure comes from: a logical GPU's limit, or its card's memory."""
    card = _logical_gpus(assignment, inventory).get(device)
    if card is None:
        return "its memory"
    return (
        f"its memory limit, {limit} MiB: placement.memory_limit_mb or its share of GPU {card[0]}"
        if card[0] in assignment.memory_limits_mb
        else f"GPU {card[0]}'s memory, nvidia-smi"
    )


def table(
    assignment: Assignment, footprints: Sequence[Footprint | None], inventory: Inventory, unit: str = "stage"
) -> str:
    """plan_only=true: each stage's estimated peak and its parts next to its device's memory, one
    line per stage; on logical CPUs the sum next to the host's shared memory. `unit` names a stage
    (`variant` side by side)."""
    memory = device_memory_mb(assignment, inventory)
    devices = stage_devices(assignment, len(footprints))
    lines = [f"memory estimate (per {unit}: weights + gradients + optimizer + activations held + inputs):"]
    for k, f in enumerate(footprints):
        d = devices[k][0] if devices[k] else None
        if f is None:
            lines.append(f"  {unit} {k}: unknown before it is built")
            continue
        if d is None:
            mem = "every replica holds it"
        elif d in memory:
            mem = f"{d}: {human(memory[d] * MB)}" if memory[d] is not None else f"{d}: memory unknown"
        else:
            mem = f"{d}: shares the host's memory"
        lines.append(f"  {unit} {k}: {human(f.total)} ({_parts(f)}); {mem}")
    known = [f.total for f in footprints if f is not None]
    if assignment.kind == "CPU" and known:
        lines.append(
            f"  all {unit}s: {human(sum(known))} (logical CPU devices share one allocator: the process's "
            "peak is compared with this sum)"
        )
    return "\n".join(lines)
