"""`cluster.launcher=slurm`: one `srun python -m chain ...` whose tasks make the cluster. Task 0 is
the client, task k > 0 serves as worker k - 1. Each task's address is its node (from the step's
compressed node list, `SLURM_STEP_NODELIST`) and `cluster.port_base` plus its rank on that node;
tasks are laid out on nodes in blocks (`SLURM_STEP_TASKS_PER_NODE`), as TensorFlow's
`SlurmClusterResolver` assumes. Pure: reads the environment given, imports no TensorFlow."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from chain.errors import ConfigError


@dataclass(frozen=True)
class SlurmJob:
    """This task of the step: its rank, every task's address (task 0 the client's), and the GPUs it
    may see (`CUDA_VISIBLE_DEVICES`; None: leave it as Slurm set it)."""

    task: int
    addresses: tuple[str, ...]
    visible_gpus: str | None = None

    @property
    def client(self) -> str:
        return self.addresses[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.addresses[1:]


def hostnames(text: str) -> list[str]:
    """Slurm's compressed host list (`node[01-03,7],gpu1`) expanded, in order; zero-padding kept."""
    names: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]*)(?:\[([^\]]*)\])?([^,\[]*),?", text.strip()):
        if not prefix and not ranges:
            continue
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ConfigError(f"SLURM_STEP_NODELIST={text!r}: {part!r} is not a number or a range N-M")
            for n in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return names


def tasks_per_node(text: str) -> list[int]:
    """`SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`) -> one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ConfigError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: expected counts such as 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def job(env: Mapping[str, str], port_base: int) -> SlurmJob:
    """This task of the Slurm step that `env` (the process's environment) describes; one ConfigError
    line naming the variable that is missing or wrong."""

    def read(key: str) -> str:
        if not env.get(key):
            raise ConfigError(
                f"cluster.launcher=slurm needs {key}, which srun sets in every task of a step: "
                f"run the command under srun (or set cluster.launcher=none)"
            )
        return env[key]

    ntasks, rank = read("SLURM_NTASKS"), read("SLURM_PROCID")
    if not ntasks.isdigit() or not rank.isdigit() or not int(rank) < int(ntasks):
        raise ConfigError(f"SLURM_PROCID={rank!r} and SLURM_NTASKS={ntasks!r} must be numbers, 0 <= procid < ntasks")
    nodes = hostnames(read("SLURM_STEP_NODELIST"))
    counts = tasks_per_node(
        env.get("SLURM_STEP_TASKS_PER_NODE")
        or env.get("SLURM_TASKS_PER_NODE")
        or str(-(-int(ntasks) // max(1, len(nodes))))
    )
    if len(counts) != len(nodes) or sum(counts) < int(ntasks):
        raise ConfigError(
            f"SLURM_STEP_NODELIST names {len(nodes)} nodes and SLURM_STEP_TASKS_PER_NODE "
            f"{sum(counts)} tasks on {len(counts)}: they do not describe {ntasks} tasks"
        )
    if int(ntasks) < 2:
        raise ConfigError(
            "cluster.launcher=slurm needs at least 2 tasks (srun -n 2 or more): task 0 is the client, "
            "the others its workers"
        )
    addresses, local = [], []
    for node, count in zip(nodes, counts):
        for r in range(count):
            addresses.append(f"{node}:{port_base + r}")
            local.append(r)
    task = int(rank)
    return SlurmJob(task, tuple(addresses[: int(ntasks)]), visible_gpus(env, local[task]))


def visible_gpus(env: Mapping[str, str], local_rank: int) -> str | None:
    """`CUDA_VISIBLE_DEVICES` for the task of rank `local_rank` on its node: its share of the node's
    GPUs when `SLURM_GPUS_PER_TASK` is set (None when Slurm already gave each task its own, or no GPUs)."""
    per_task = env.get("SLURM_GPUS_PER_TASK", "").split(":")[-1]
    if not per_task:
        return None
    if not per_task.isdigit() or int(per_task) < 1:
        raise ConfigError(f"SLURM_GPUS_PER_TASK={env['SLURM_GPUS_PER_TASK']!r} must be a number of GPUs")
    g = int(per_task)
    seen = env.get("CUDA_VISIBLE_DEVICES")
    gpus = seen.split(",") if seen else [str(i) for i in range((local_rank + 1) * g)]
    if len(gpus) == g:
        return None  # Slurm bound this task to its own GPUs
    mine = gpus[local_rank * g : (local_rank + 1) * g]
    if len(mine) < g:
        raise ConfigError(
            f"SLURM_GPUS_PER_TASK={g}: task {local_rank} of its node needs GPUs "
            f"{local_rank * g}..{(local_rank + 1) * g - 1}, CUDA_VISIBLE_DEVICES={seen!r} has {len(gpus)}"
        )
    return ",".join(mine)
