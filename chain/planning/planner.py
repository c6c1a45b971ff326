"""Device planning: from the machine's inventory and the config to a placement.

`assign` is a pure function of the validated `placement` section, the number of stages
and an `Inventory` (so it can be tested for machines we do not have);
`chain.planning.devices` applies a plan to TensorFlow and checks the devices that exist
afterwards. Nothing outside `chain.planning` discovers or splits devices.

Logical GPUs are numbered by TensorFlow card after card, in physical order, over the
visible cards only: card 0's logical devices first, then card 1's. Every plan below
relies on that numbering.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from chain.config.checks import placement_fits
from chain.config.device_names import canonical
from chain.config.schema import PlacementSettings
from chain.errors import ConfigError, DeviceError, plural
from chain.planning.footprint import Footprint
from chain.planning.inventory import Gpu, Inventory

__all__ = ["Assignment", "assign", "shared", "PIPELINE", "MIRRORED", "REPLICATED"]

PIPELINE = "pipeline"
MIRRORED = "mirrored"
REPLICATED = "pipeline_replicas"  # R copies of the pipeline, each on its own devices (placement.replicas)
CPU_REPLICAS = 2  # mirrored without a GPU: enough replicas to exercise the all-reduce


@dataclass(frozen=True)
class Assignment:
    """The planner's decision, frozen: what is settled after planning (the footprints, the devices
    checked to exist, later notes) makes a new record (`replace`, `noted`). How a batch cuts over its
    replicas is the run's, not the placement's (`RunSpec.batch_cut`, `chain.prepared.cut_batch`).

    `devices[k]` is stage k's device (canonical `/device:GPU:1` form); None for every
    stage when `topology` is "mirrored", where each replica holds all stages and
    `mirrored_devices` lists the replicas' devices. `kind` is the device type the plan splits
    ("GPU" or "CPU"). `split[p]` is how many logical devices physical device p is cut
    into, `memory_limits_mb[p]` their limits (GPUs only); a physical device absent from
    `split` keeps TensorFlow's default (one logical device, no limit). `visible` lists
    the physical GPUs TensorFlow may use (None: all). `physical` maps each logical
    device the plan uses to the physical device behind it. `copies[r][k]` is copy r's stage k when
    `topology` is "pipeline_replicas" (R copies of the pipeline; `devices` is then `copies[0]`); empty otherwise.
    `footprints[k]` is stage k's estimated peak memory (`chain.planning.footprint`; None: known once
    built), filled by the preparation pass; empty before.
    """

    devices: tuple[str | None, ...]
    kind: str
    split: dict[int, int] = field(default_factory=dict)  # (dicts: never changed after planning, tests/test_frozen.py)
    memory_limits_mb: dict[int, list[int]] = field(default_factory=dict)
    topology: str = PIPELINE  # pipeline, mirrored or pipeline_replicas (the planner's `topology:` note)
    mirrored_devices: tuple[str, ...] = ()  # one per replica (topology "mirrored")
    physical: dict[str, str] = field(default_factory=dict)
    visible: tuple[int, ...] | None = None
    memory_growth: bool = False
    notes: tuple[str, ...] = ()
    cluster: tuple[str, ...] = ()  # the workers' addresses when stages run on them
    multi_worker: tuple[str, ...] = ()  # TF_CONFIG's workers when every host trains a replica
    task: int = 0  # this process's worker index in `multi_worker`
    copies: tuple[tuple[str, ...], ...] = ()  # copy -> stage -> device (topology "pipeline_replicas")
    footprints: tuple[Footprint | None, ...] = ()  # each stage's estimated peak (chain.prepared.estimate)

    @property
    def local_mirrored_devices(self) -> tuple[str, ...]:
        """The mirrored devices this process runs (a multi-worker run's other replicas are on other hosts)."""
        if not self.multi_worker:
            return self.mirrored_devices
        return tuple(d for d in self.mirrored_devices if f"/task:{self.task}/" in d)

    def noted(self, *notes: str) -> Assignment:
        """This assignment with `notes` added after its own."""
        return replace(self, notes=(*self.notes, *notes))


def _index(device: str) -> int:
    return int(device.rsplit(":", 1)[1])


def _spread(n_stages: int, n_cards: int) -> list[int]:
    """Stage k -> card, in contiguous runs (neighbours share a card) of near-equal size."""
    return [k * n_cards // n_stages for k in range(n_stages)]


def _ranges(owner: Sequence[int], n_cards: int) -> list[str]:
    """'GPU 0: stages 0-2' for each card, from a stage -> card list."""
    out = []
    for p in range(n_cards):
        mine = [k for k, o in enumerate(owner) if o == p]
        span = f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0])
        out.append(f"{p}: stage{'s' if len(mine) > 1 else ''} {span}")
    return out


def _describe(gpu: Gpu, cvd: str | None) -> str:
    """The physical card behind a logical GPU, with CUDA_VISIBLE_DEVICES' renumbering."""
    if cvd is not None and gpu.card is not None:
        return f"GPU:{gpu.index} (card {gpu.card})"
    return f"GPU:{gpu.index}"


def assign(pcfg: PlacementSettings, n_stages: int, inventory: Inventory, side_by_side: bool = False) -> Assignment:
    """Decide where every stage runs (the rules: docs/devices.md, its table of what the planner does).

    `pcfg` is the validated `placement` section. Pure: no TensorFlow runtime. Raises
    ConfigError for settings that cannot work anywhere and DeviceError for settings this
    machine cannot satisfy; both name the key. `side_by_side`: the stages are independent
    models (mode=side_by_side), which the topology note says.
    """
    placement_fits(pcfg, n_stages)  # checked with the settings already; `plan` is also called on its own
    gpus = _visible(pcfg.visible, inventory)
    copies = pipeline_copies(pcfg, n_stages, len(gpus))
    if copies > 1:
        p = _replicated(pcfg, n_stages, copies, gpus, inventory.cuda_visible_devices)
    elif pcfg.devices:
        p = _explicit(pcfg, n_stages, gpus, inventory.cuda_visible_devices)
    elif len(gpus) >= n_stages:
        p = _one_per_stage(pcfg, n_stages, gpus, inventory.cuda_visible_devices)
        if pcfg.fallback == MIRRORED:
            p = p.noted(f"placement.fallback=mirrored not needed: {len(gpus)} GPUs for {n_stages} stages, one each")
    elif pcfg.fallback == "error":
        raise DeviceError(
            f"placement.fallback=error: {n_stages} stages need {n_stages} GPUs, {len(gpus)} visible; "
            "use placement.fallback=virtual (split the GPUs) or mirrored (data parallel)"
        )
    elif pcfg.fallback == MIRRORED:
        p = _mirrored(pcfg, n_stages, gpus, inventory.cuda_visible_devices)
    elif gpus:
        p = _virtual(pcfg, n_stages, gpus, inventory.cuda_visible_devices)
    else:
        p = _cpu([f"/device:CPU:{k}" for k in range(n_stages)], n_stages)
    if p.visible is None and pcfg.visible is not None:
        p = replace(p, visible=tuple(g.index for g in gpus))
    if p.kind == "CPU" and pcfg.memory_limit_mb is not None:
        p = p.noted("placement.memory_limit_mb ignored: memory limits apply to GPUs only")
    if side_by_side and p.topology != MIRRORED:
        p = replace(p, notes=(_side_by_side_topology(p, n_stages), *p.notes))
    elif p.topology != REPLICATED:  # copies of the pipeline say why themselves (`_replicated`)
        p = replace(p, notes=(_topology(pcfg, p, n_stages, len(gpus)), *p.notes))
    p = _growth(pcfg, p, gpus)
    if inventory.cuda_visible_devices is not None and gpus:
        behind = ", ".join(f"GPU:{g.index} is card {g.card}" for g in gpus if g.card is not None)
        p = p.noted(f"CUDA_VISIBLE_DEVICES={inventory.cuda_visible_devices}" + (f": {behind}" if behind else ""))
    return replace(p, notes=(*inventory.notes, *p.notes))


def _side_by_side_topology(p: Assignment, n_models: int) -> str:
    """mode=side_by_side's topology in one line: independent models, not stages of a pipeline."""
    devices = len(set(p.devices))
    where = "a device per variant" if devices == n_models else f"on {devices} device{'s' * (devices != 1)}"
    return f"topology: side by side ({n_models} independent model{'s' * (n_models != 1)}, {where})"


def _topology(pcfg: PlacementSettings, p: Assignment, n_stages: int, n_gpus: int) -> str:
    """Which of the three topologies the assignment is, and why: one line."""
    if p.topology == MIRRORED:
        return (
            f"topology: mirrored (placement.fallback=mirrored, {n_gpus} GPU(s) for {n_stages} stages): every "
            "replica holds the whole chain"
        )
    if pcfg.replicas is None:
        why = "placement.replicas unset"
    elif pcfg.fallback == MIRRORED:
        why = (
            f"placement.replicas={pcfg.replicas} ignored: placement.fallback=mirrored is not needed with a device "
            "per stage; for copies of the pipeline use placement.fallback=virtual"
        )
    elif pcfg.replicas == "auto":
        why = f"placement.replicas=auto: {n_gpus} GPU(s) hold one copy of {n_stages} stages"
    else:
        why = "placement.replicas=1"
    if pcfg.exchange_dtype != "float32":  # only `auto` gets here with it (checks refuse it without copies)
        why += f"; placement.exchange_dtype={pcfg.exchange_dtype} unused: no copies exchange gradients"
    return f"topology: pipeline (a device per stage, one copy; {why})"


def pipeline_copies(pcfg: PlacementSettings, n_stages: int, n_gpus: int) -> int:
    """How many copies of the pipeline `placement.replicas` asks for (1: none besides the pipeline
    itself). `auto`: as many as the GPUs hold, a device per stage each; on a CPU, one (logical CPU
    devices share one thread pool: copies would add no compute)."""
    r = pcfg.replicas
    if pcfg.fallback == MIRRORED or r is None:
        return 1
    if r == "auto":
        return max(1, n_gpus // n_stages)
    return r


def _replicated(
    pcfg: PlacementSettings, n_stages: int, copies: int, gpus: Sequence[Gpu], cvd: str | None
) -> Assignment:
    """`copies` copies of the pipeline: R x K devices planned as for R*K stages (one GPU each, the
    cards split with fallback=virtual, or the CPU split), replica r's stages on devices r*K .. r*K+K-1."""
    n = copies * n_stages
    if isinstance(pcfg.memory_limit_mb, (list, tuple)):  # one limit per stage: the same for every copy
        pcfg = replace(pcfg, memory_limit_mb=tuple(pcfg.memory_limit_mb) * copies)
    if len(gpus) >= n:
        p = _one_per_stage(pcfg, n, gpus, cvd)
        why = f"{len(gpus)} GPUs hold {copies} copies of {n_stages} stages, a GPU each"
    elif not gpus:
        p = _cpu([f"/device:CPU:{k}" for k in range(n)], n)
        why = "no GPU: a logical CPU device per replica and stage"
    elif pcfg.fallback == "error":
        raise DeviceError(
            f"placement.replicas={pcfg.replicas}: {copies} copies of {n_stages} stages need {n} GPUs, "
            f"{len(gpus)} visible; use placement.replicas={max(1, len(gpus) // n_stages)} "
            "or placement.fallback=virtual (split the GPUs)"
        )
    else:
        p = _virtual(pcfg, n, gpus, cvd)
        why = f"{len(gpus)} GPU(s) < {n} replica stages: split with placement.fallback=virtual"
    rows = tuple(tuple(p.devices[r * n_stages : (r + 1) * n_stages]) for r in range(copies))
    note = (
        f"topology: pipeline x replicas, {copies} copies of the {n_stages}-stage pipeline "
        f"(placement.replicas={pcfg.replicas}; {why}); each copy trains 1/{copies} of every batch, and stage k's gradients are averaged over its "
        "copies before each copy's identical update"
    )
    return replace(p, copies=rows, devices=rows[0], topology=REPLICATED, notes=(note, *p.notes))


def _visible(visible: list[int] | None, inventory: Inventory) -> tuple[Gpu, ...]:
    """The GPUs `placement.visible` keeps, in TensorFlow's (physical) order."""
    if visible is None:
        return inventory.gpus
    have = [g.index for g in inventory.gpus]
    after = (
        f" (after CUDA_VISIBLE_DEVICES={inventory.cuda_visible_devices})"
        if inventory.cuda_visible_devices is not None
        else ""
    )
    for i, index in enumerate(visible):
        if index not in have:
            sees = f"GPUs {', '.join(map(str, have))}" if have else "no GPU"
            raise DeviceError(f"placement.visible[{i}]={index}: no such GPU; TensorFlow sees {sees}{after}")
        if index in visible[:i]:
            raise ConfigError(f"placement.visible[{i}]={index} is listed twice")
    return tuple(g for g in inventory.gpus if g.index in visible)


def _cpu(devices: Sequence[str], n_stages: int) -> Assignment:
    """Rule 4: no GPU; the CPU split into one logical device per stage."""
    return Assignment(
        devices=tuple(devices),
        kind="CPU",
        split={0: n_stages},
        physical={d: "CPU:0" for d in devices if d.startswith("/device:CPU:")},
        notes=(f"no GPU: CPU split into {n_stages} logical devices",),
    )


def _one_per_stage(pcfg: PlacementSettings, n_stages: int, gpus: Sequence[Gpu], cvd: str | None) -> Assignment:
    """Rule 2: stage k on GPU k; cards no stage uses are hidden from TensorFlow."""
    used = list(gpus[:n_stages])
    devices = [f"/device:GPU:{k}" for k in range(n_stages)]
    split, limits, notes = _limits(pcfg, used, [1] * n_stages, list(range(n_stages)))
    visible = None
    if len(gpus) > n_stages:
        # TensorFlow reserves memory on every visible GPU when its runtime starts.
        visible = tuple(g.index for g in used)
        notes.append(
            f"GPU {', '.join(str(g.index) for g in gpus[n_stages:])} unused: hidden from TensorFlow "
            "so it takes none of their memory"
        )
    return Assignment(
        devices=tuple(devices),
        kind="GPU",
        split=split,
        memory_limits_mb=limits,
        notes=tuple(notes),
        physical={d: _describe(g, cvd) for d, g in zip(devices, used)},
        visible=visible,
    )


def _virtual(pcfg: PlacementSettings, n_stages: int, gpus: Sequence[Gpu], cvd: str | None) -> Assignment:
    """Rule 3, fallback=virtual: split the cards into one logical GPU per stage."""
    owner = _spread(n_stages, len(gpus))
    per_card = [owner.count(p) for p in range(len(gpus))]
    # Logical GPUs are numbered card after card and `owner` never decreases, so stage k's
    # logical GPU is GPU:k.
    devices = [f"/device:GPU:{k}" for k in range(n_stages)]
    split, limits, notes = _limits(pcfg, gpus, per_card, list(range(n_stages)))
    notes.insert(
        0,
        f"{len(gpus)} GPU(s) < {n_stages} stages: split into {n_stages} logical GPUs "
        f"(GPU {'; '.join(_ranges(owner, len(gpus)))})",
    )
    return Assignment(
        devices=tuple(devices),
        kind="GPU",
        split=split,
        memory_limits_mb=limits,
        notes=tuple(notes),
        physical={d: _describe(gpus[p], cvd) for d, p in zip(devices, owner)},
    )


def _explicit(pcfg: PlacementSettings, n_stages: int, gpus: Sequence[Gpu], cvd: str | None) -> Assignment:
    """Rule 1: the user's mapping; cards are split evenly when it names more logical GPUs than cards."""
    devices = []
    for k, d in enumerate(pcfg.devices):
        try:
            devices.append(canonical(d))
        except DeviceError as e:
            raise DeviceError(f"placement.devices[{k}]: {e}") from None
    if not gpus:
        return _cpu(devices, n_stages)
    named = [_index(d) for d in devices if d.startswith("/device:GPU:")]
    per = max(1, -(-(max(named, default=-1) + 1) // len(gpus)))  # ceil: logical GPUs per card
    logical = [_index(d) if d.startswith("/device:GPU:") else None for d in devices]
    split, limits, notes = _limits(pcfg, gpus, [per] * len(gpus), logical)
    if per > 1:
        notes.insert(
            0, f"placement.devices names GPU:{max(named)}: each of {len(gpus)} GPU(s) split into {per} logical GPUs"
        )
    physical = {}
    for d in devices:
        if d.startswith("/device:GPU:") and _index(d) < per * len(gpus):
            physical[d] = _describe(gpus[_index(d) // per], cvd)
        elif d == "/device:CPU:0":
            physical[d] = "CPU:0"
    return Assignment(
        devices=tuple(devices), kind="GPU", split=split, memory_limits_mb=limits, physical=physical, notes=tuple(notes)
    )


def _mirrored(pcfg: PlacementSettings, n_stages: int, gpus: Sequence[Gpu], cvd: str | None) -> Assignment:
    """Rule 3, fallback=mirrored: every replica holds the whole chain (data parallel)."""
    if isinstance(pcfg.memory_limit_mb, (list, tuple)):
        raise ConfigError(
            "placement.memory_limit_mb: a list gives one limit per stage, but with "
            "placement.fallback=mirrored every replica holds all stages; give one number"
        )
    n = None if pcfg.replicas == "auto" else pcfg.replicas
    if not gpus:
        n = n or CPU_REPLICAS
        replicas = tuple(f"/device:CPU:{i}" for i in range(n))
        return Assignment(
            devices=(None,) * n_stages,
            kind="CPU",
            split={0: n},
            topology=MIRRORED,
            mirrored_devices=replicas,
            physical={d: "CPU:0" for d in replicas},
            notes=(f"no GPU: the whole chain on each of {n} logical CPU replicas (MirroredStrategy)",),
        )
    n = n or len(gpus)
    if n > len(gpus):
        raise DeviceError(f"placement.replicas={n}: only {len(gpus)} GPU(s) visible; one replica per GPU")
    used = list(gpus[:n])
    replicas = tuple(f"/device:GPU:{i}" for i in range(n))
    split, limits, notes = _limits(pcfg, used, [1] * n, [])  # one number or none here
    notes.insert(
        0, f"{len(gpus)} GPU(s) < {n_stages} stages: the whole chain on each of {n} GPU replicas (MirroredStrategy)"
    )
    visible = None
    if n < len(gpus):
        visible = tuple(g.index for g in used)
        notes.append(f"GPU {', '.join(str(g.index) for g in gpus[n:])} unused: hidden from TensorFlow")
    return Assignment(
        devices=(None,) * n_stages,
        kind="GPU",
        split=split,
        memory_limits_mb=limits,
        topology=MIRRORED,
        mirrored_devices=replicas,
        physical={d: _describe(g, cvd) for d, g in zip(replicas, used)},
        notes=tuple(notes),
        visible=visible,
    )


def _limits(
    pcfg: PlacementSettings, cards: Sequence[Gpu], per_card: Sequence[int], logical: Sequence[int | None]
) -> tuple[dict[int, int], dict[int, list[int]], list[str]]:
    """Memory limit of every logical GPU: (split, limits, notes), keyed by physical index.

    `per_card[i]` is how many logical GPUs card `cards[i]` gets; `logical[k]` is the
    logical GPU of stage k (None: not on a GPU). A card keeps TensorFlow's default
    (absent from the result) when it is not split and no limit is asked for. TensorFlow
    requires a limit on every logical GPU of a split card.
    """
    given, reserve = pcfg.memory_limit_mb, pcfg.reserve_mb
    split: dict[int, int] = {}
    limits: dict[int, list[int]] = {}
    notes: list[str] = []
    start = 0
    for card, n in zip(cards, per_card):
        mine: list[int | None]
        if isinstance(given, (list, tuple)):
            mine = []
            for j in range(start, start + n):
                asked = {k: given[k] for k, lg in enumerate(logical) if lg == j}
                if len(set(asked.values())) > 1:
                    a = min(asked)
                    b = min(k for k in asked if asked[k] != asked[a])
                    raise ConfigError(
                        f"placement.memory_limit_mb: stages {a} and {b} share /device:GPU:{j} "
                        f"but ask for {asked[a]} and {asked[b]} MB"
                    )
                mine.append(next(iter(asked.values()), None))
            if n == 1 and mine == [None]:
                mine = []
        elif given is not None:
            mine = [given] * n
        else:
            mine = [None] * n if n > 1 else []
        start += n
        if not mine:
            continue  # TensorFlow's default: one logical GPU, no limit
        open_slots = mine.count(None)
        if open_slots:
            # Share what the card has left, keeping reserve_mb for CUDA's own use.
            if card.memory_mb is None:
                raise DeviceError(
                    f"placement.memory_limit_mb: GPU {card.index} is split into {n} logical GPUs, which TensorFlow "
                    "requires a memory limit for, and its memory is unknown; set placement.memory_limit_mb "
                    "(MB per logical GPU, or one per stage)"
                )
            free = card.memory_mb - reserve - sum(m for m in mine if m is not None)
            share = free // open_slots
            if share < 1:
                raise DeviceError(
                    f"placement.reserve_mb={reserve} leaves no memory on GPU {card.index} "
                    f"({card.memory_mb} MB) for {open_slots} logical GPU(s)"
                )
            mine = [share if m is None else m for m in mine]
            notes.append(
                f"GPU {card.index}: {card.memory_mb} MB (nvidia-smi) - {reserve} MB reserve: "
                f"logical GPUs of {', '.join(str(m) for m in mine)} MB"
            )
        else:
            where = f"{card.memory_mb} MB" if card.memory_mb else "memory unknown"
            notes.append(
                f"GPU {card.index} ({where}): logical GPUs of {', '.join(str(m) for m in mine)} MB (placement.memory_limit_mb)"
            )
        total = sum(mine)
        if card.memory_mb is not None and total > card.memory_mb:
            raise DeviceError(
                f"placement.memory_limit_mb: limits on GPU {card.index} add up to {total} MB, "
                f"more than its {card.memory_mb} MB"
            )
        if card.memory_mb is not None and total > card.memory_mb - reserve:
            notes.append(f"GPU {card.index}: limits leave less than placement.reserve_mb={reserve} MB free")
        split[card.index] = n
        limits[card.index] = mine
    return split, limits, notes


def _growth(pcfg: PlacementSettings, p: Assignment, gpus: Sequence[Gpu]) -> Assignment:
    """`p` with placement.memory_growth where TensorFlow allows it: every GPU or none."""
    if not pcfg.memory_growth:
        return p
    if p.kind != "GPU" or not gpus:
        return p.noted("placement.memory_growth ignored: it applies to GPUs only")
    if p.split:
        # TensorFlow cannot grow a GPU that has logical devices, and growth must be the
        # same on every visible GPU, so one split card rules it out everywhere.
        return p.noted(
            f"placement.memory_growth not applied: GPU {', '.join(map(str, p.split))} "
            "has logical devices with memory limits, and TensorFlow needs the same setting on every GPU"
        )
    return replace(p, memory_growth=True).noted("memory growth on: each GPU allocates memory as needed")


def assign_multi_worker(
    pcfg: PlacementSettings, n_stages: int, addresses: Sequence[str], task: int, gpus: Sequence[Gpu]
) -> Assignment:
    """`placement.fallback=mirrored` across hosts: every worker of TF_CONFIG runs the same command and
    trains the whole chain on its own devices (its GPUs, else its CPU), one replica each, with
    `tf.distribute.MultiWorkerMirroredStrategy`; workers are assumed alike (the same GPU count).
    Replicas are named by task, in TF_CONFIG's order. Pure."""
    if pcfg.fallback != MIRRORED:
        raise ConfigError(
            f"TF_CONFIG names this process worker {task} of {len(addresses)} (its task): that form trains "
            f"data parallel on every host and needs placement.fallback=mirrored (is {pcfg.fallback}); "
            "for stages on cluster workers, give the client cluster.workers, or TF_CONFIG with a chief"
        )
    if pcfg.devices:
        raise ConfigError(
            "placement.devices puts each stage on a device, but TF_CONFIG with a task trains the whole chain "
            "on every worker (placement.fallback=mirrored); remove placement.devices"
        )
    kind = "GPU" if gpus else "CPU"
    physical = {
        f"/job:worker/replica:0/task:{t}/device:{kind}:{i}": f"worker {t} {address}"
        for t, address in enumerate(addresses)
        for i in range(len(gpus) or 1)
    }
    notes = [
        f"TF_CONFIG: this is worker {task} of {len(addresses)} ({addresses[task]}); every worker trains the "
        f"whole chain on its share of each batch (MultiWorkerMirroredStrategy) and keeps its own run directory"
    ]
    for key in ("memory_limit_mb", "visible", "replicas"):
        if getattr(pcfg, key) is not None:
            notes.append(f"placement.{key} ignored: a multi-worker run uses every worker's {kind}s, one replica each")
    return Assignment(
        devices=(None,) * n_stages,
        kind=kind,
        topology=MIRRORED,
        mirrored_devices=tuple(physical),
        physical=physical,
        multi_worker=tuple(addresses),
        task=task,
        notes=tuple(notes),
    )


def assign_cluster(
    pcfg: PlacementSettings, n_stages: int, tasks: Sequence[Sequence[str]], addresses: Sequence[str]
) -> Assignment:
    """Place stages on cluster workers by the same rules as on one machine (one device per stage:
    the workers' GPUs in task order, else each worker's CPU; fewer devices than stages: the
    fallbacks). `tasks[i]` lists worker i's devices. Pure."""
    where = {d: f"worker {i} {addresses[i]} {d.rsplit('device:', 1)[1]}" for i, t in enumerate(tasks) for d in t}
    gpus = [d for t in tasks for d in t if "/device:GPU:" in d]
    pool = gpus or [next(d for d in t if "/device:CPU:" in d) for t in tasks if t]
    copies = max(1, len(pool) // n_stages) if pcfg.replicas == "auto" else pipeline_copies(pcfg, n_stages, 0)
    if copies > 1:
        return _cluster_grid(pcfg, n_stages, copies, pool, where, addresses)
    if pcfg.devices:
        devices = [canonical(d) for d in pcfg.devices]
    else:
        pool = gpus or [next(d for d in t if "/device:CPU:" in d) for t in tasks if t]
        if len(pool) >= n_stages:
            devices = pool[:n_stages]
        elif pcfg.fallback == "error":
            raise DeviceError(
                f"placement.fallback=error: {n_stages} stages need {n_stages} devices, the cluster's "
                f"{plural(len(tasks), 'worker')} have {plural(len(pool), 'GPU' if gpus else 'CPU')}"
            )
        elif pcfg.fallback == MIRRORED:
            raise DeviceError(
                "placement.fallback=mirrored across hosts is data parallel: run the same command on every "
                "host with its own TF_CONFIG instead of cluster.workers (see docs/cluster.md)"
            )
        else:
            devices = [pool[k * len(pool) // n_stages] for k in range(n_stages)]
    notes = [f"cluster: {plural(len(addresses), 'worker')} ({', '.join(addresses)}); this process is the client"]
    if not pcfg.devices and len(set(devices)) < n_stages:
        notes.append(
            f"{plural(len(set(devices)), 'device')} < {n_stages} stages: neighbouring stages share a worker's device "
            "(a worker's devices are not split from the client)"
        )
    for key in ("memory_limit_mb", "visible", "replicas"):
        if getattr(pcfg, key) is not None and (key != "replicas" or pcfg.fallback == MIRRORED):
            notes.append(f"placement.{key} ignored: it configures this machine's devices; a worker has its own")
    return Assignment(
        devices=tuple(devices),
        kind="GPU" if gpus else "CPU",
        physical={d: where.get(d, "-") for d in devices},
        cluster=tuple(addresses),
        notes=tuple(notes),
    )


def shared(p: Assignment, rows: Sequence[int], schedule: str, rule: str) -> Assignment:
    """`p`, planned for D devices, with the schedule's stages on them: stage k on device `rows[k]`
    (the schedule's own map: interleaved's loop, stage k on device k mod D; zbv's V, stage k and
    2D-1-k on device k; a schedule file's rows). `schedule` names the setting and `rule` says the
    map in words (`chain.schedule.schedules.rows_rule`), both for the note."""
    d, n_stages = len(p.devices), len(rows)
    if p.topology == MIRRORED or d >= n_stages:
        return p
    each = " (in every copy)" if p.copies else ""
    # the topology's note was written for the D devices of a copy: say how many stages they hold
    notes = tuple(
        n.replace(f"copies of the {d}-stage pipeline", f"copies of the {n_stages}-stage pipeline on {d} devices")
        for n in p.notes
    )
    return replace(
        p,
        devices=tuple(p.devices[r] for r in rows),
        copies=tuple(tuple(row[r] for r in rows) for row in p.copies),  # each copy's row
        notes=notes,
    ).noted(f"pipeline.schedule={schedule}: {n_stages} stages on {d} devices{each}, {rule}")


def _cluster_grid(
    pcfg: PlacementSettings,
    n_stages: int,
    copies: int,
    pool: Sequence[str],
    where: dict[str, str],
    addresses: Sequence[str],
) -> Assignment:
    """`copies` copies of the pipeline on the workers' devices, in task order: replica r's stage k on
    device r*K+k; a worker device each (R x K workers), never shared."""
    n = copies * n_stages
    if len(pool) < n:
        raise DeviceError(
            f"placement.replicas={pcfg.replicas}: {copies} copies of {n_stages} stages need {n} devices, "
            f"the cluster's {plural(len(addresses), 'worker')} have {len(pool)}; give cluster.workers {n} workers "
            f"or use placement.replicas={max(1, len(pool) // n_stages)}"
        )
    rows = tuple(tuple(pool[r * n_stages : (r + 1) * n_stages]) for r in range(copies))
    devices = [d for row in rows for d in row]
    notes = (
        f"topology: pipeline x replicas: {copies} copies of the {n_stages}-stage pipeline on {n} worker devices; "
        "each copy trains its share of every batch, stage gradients averaged over the copies",
        f"cluster: {plural(len(addresses), 'worker')} ({', '.join(addresses)}); this process is the client",
    )
    return Assignment(
        devices=rows[0],
        kind="GPU" if "/device:GPU:" in pool[0] else "CPU",
        topology=REPLICATED,
        copies=rows,
        physical={d: where.get(d, "-") for d in devices},
        cluster=tuple(addresses),
        notes=notes,
    )


def check_memory(
    assignment: Assignment,
    need: Sequence[int],
    inventory: Inventory,
    cpu_memory_mb: int | None,
    host_memory_mb: int | None,
) -> None:
    """Refuse a chain whose estimated memory (`need[k]` bytes for stage k) cannot fit.

    On CPU every logical device shares the host's memory: the sum over stages (times the
    replicas of a mirrored run) is held to `placement.cpu_memory_mb`, or the machine's
    memory. On GPUs each card is held to its memory (when nvidia-smi told it). Raises a
    DeviceError with the estimate.
    """
    from chain.config.shapes import human

    MB = 1 << 20
    copies = len(assignment.mirrored_devices) if assignment.topology == MIRRORED else max(1, len(assignment.copies))
    if assignment.cluster:
        return  # the workers' memory is theirs to know
    if assignment.kind == "CPU":
        limit = cpu_memory_mb or host_memory_mb
        total = sum(need) * copies
        if limit and total > limit * MB:
            biggest = max(range(len(need)), key=lambda k: need[k])
            key = "placement.cpu_memory_mb" if cpu_memory_mb else "the machine's memory; placement.cpu_memory_mb"
            raise DeviceError(
                f"the chain needs about {human(total)} of memory (stage {biggest}: {human(need[biggest])}; weights, "
                f"gradients, optimizer state and activations), more than the {human(limit * MB)} allowed ({key}); "
                "use a smaller model.width, model.depth or data.batch_size"
            )
        return
    memory = {g.index: g.memory_mb for g in inventory.gpus}
    per_card: dict[int, int] = {}
    grid = [d for row in assignment.copies for d in row]  # copies of a pipeline: stage k is device k mod K
    for k, device in enumerate(
        grid or (assignment.devices if assignment.topology != MIRRORED else assignment.mirrored_devices)
    ):
        physical = assignment.physical.get(device, "")
        if physical.startswith("GPU:"):
            card = int(physical.split()[0].split(":")[1])
            per_card[card] = per_card.get(card, 0) + (
                sum(need) if assignment.topology == MIRRORED else need[k % len(need)]
            )
    for card, total in per_card.items():
        if memory.get(card) and total > memory[card] * MB:
            raise DeviceError(
                f"the stages on GPU {card} need about {human(total)} of memory, more than its "
                f"{human(memory[card] * MB)}; use a smaller model.width, model.depth or "
                "data.batch_size, or more GPUs"
            )
