"""The machine's GPUs as the planner sees them: TensorFlow's count, nvidia-smi's memory.

TensorFlow does not report a physical GPU's total memory before its runtime starts, and
the runtime must not start before the planner has split the devices. So the memory
comes from `nvidia-smi`, mapped onto TensorFlow's numbering through
`CUDA_VISIBLE_DEVICES` (TensorFlow's GPU:0 is the first card that variable lists).
Everything except `discover` is pure, so tests can describe machines we do not have.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

SMI_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as TensorFlow numbers it (after `CUDA_VISIBLE_DEVICES`).

    `card` names the card behind it in nvidia-smi's numbering (or the
    `CUDA_VISIBLE_DEVICES` entry when nvidia-smi is missing); None when unknown.
    `memory_mb` is its total memory; None when unknown.
    """

    index: int
    memory_mb: int | None = None
    name: str = ""
    card: str | None = None


@dataclass(frozen=True)
class Inventory:
    """The physical GPUs of a machine, plus what discovery had to say about them."""

    gpus: tuple[Gpu, ...] = ()
    cuda_visible_devices: str | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, count: int, memory_mb: int | None = None, **kw) -> "Inventory":
        """`count` identical GPUs, e.g. `Inventory.of(8, 81920)` for eight 80 GB cards."""
        return cls(gpus=tuple(Gpu(i, memory_mb) for i in range(count)), **kw)


@dataclass(frozen=True)
class Card:
    """One row of nvidia-smi: the machine-wide view, before CUDA_VISIBLE_DEVICES."""

    index: int
    uuid: str
    name: str
    memory_mb: int | None


def parse_smi(text: str) -> list[Card]:
    """Parse the output of `SMI_QUERY` (`index, uuid, name, memory.total` per line)."""
    cards = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        memory = parts[-1]
        cards.append(
            Card(
                int(parts[0]),
                parts[1],
                ", ".join(parts[2:-1]),
                int(float(memory)) if memory.replace(".", "", 1).isdigit() else None,
            )
        )
    return cards


def visible_cards(cards: Sequence[Card], cuda_visible_devices: str | None) -> list[Card] | None:
    """The cards CUDA exposes, in the order TensorFlow numbers them.

    Follows CUDA's rules: entries are indices or (prefixes of) UUIDs, and enumeration
    stops at the first entry that names no card (so `0,7,1` on a 4-card machine
    exposes card 0 only). None: the mapping cannot be known (MIG instances).
    """
    if cuda_visible_devices is None:
        return list(cards)
    out: list[Card] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.startswith("MIG-"):
            return None  # a MIG slice has a fraction of the card's memory; nvidia-smi's total is wrong
        if entry.isdigit():
            match = [c for c in cards if c.index == int(entry)]
        else:
            match = [c for c in cards if entry and c.uuid.lower().startswith(entry.lower())]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return out


def _cvd_entries(cuda_visible_devices: str | None) -> list[str]:
    return [e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()]


def inventory(
    n_tf_gpus: int,
    cards: Sequence[Card] | None,
    cuda_visible_devices: str | None = None,
    device_order: str | None = None,
) -> Inventory:
    """Combine TensorFlow's GPU count with nvidia-smi's cards (None: nvidia-smi missing).

    Memory is attached only when the mapping from TensorFlow's numbering to the cards
    is certain; otherwise it stays unknown and a note says why.
    """
    cvd = cuda_visible_devices
    notes: list[str] = []
    entries = _cvd_entries(cvd)
    unknown = [Gpu(i, None, "", entries[i] if i < len(entries) else None) for i in range(n_tf_gpus)]
    if cards is None:
        if n_tf_gpus:
            notes.append(
                "GPU memory unknown (nvidia-smi not found): no memory limit unless placement.memory_limit_mb is given"
            )
        return Inventory(tuple(unknown), cvd, tuple(notes))
    shown = visible_cards(cards, cvd)
    if shown is None:
        notes.append(
            f"CUDA_VISIBLE_DEVICES={cvd} names MIG instances: their memory is unknown; "
            "no memory limit unless placement.memory_limit_mb is given"
        )
        return Inventory(tuple(unknown), cvd, tuple(notes))
    if not n_tf_gpus:
        if shown:
            notes.append(
                f"nvidia-smi shows {len(shown)} GPU(s) but TensorFlow sees none "
                "(a CPU-only TensorFlow build, or CUDA libraries missing): running on CPU"
            )
        return Inventory((), cvd, tuple(notes))
    if len(shown) != n_tf_gpus:
        notes.append(
            f"nvidia-smi shows {len(shown)} visible GPU(s), TensorFlow sees {n_tf_gpus}: "
            "GPU memory unknown; no memory limit unless placement.memory_limit_mb is given"
        )
        return Inventory(tuple(unknown), cvd, tuple(notes))
    if len({c.name for c in shown}) > 1 and device_order != "PCI_BUS_ID":
        # CUDA numbers cards fastest first unless told otherwise; nvidia-smi numbers them
        # by PCI bus. With identical cards the two agree; with different ones they may not.
        notes.append(
            "the GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA may number them "
            "differently from nvidia-smi: GPU memory unknown; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
            "or placement.memory_limit_mb"
        )
        return Inventory(tuple(unknown), cvd, tuple(notes))
    gpus = tuple(Gpu(i, c.memory_mb, c.name, str(c.index)) for i, c in enumerate(shown))
    return Inventory(gpus, cvd, tuple(notes))


def query_smi(timeout: float = 10.0) -> list[Card] | None:
    """nvidia-smi's cards, or None when it is missing or fails."""
    if shutil.which(SMI_QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi(out.stdout)


def discover() -> Inventory:
    """The physical GPUs TensorFlow sees, with memory from nvidia-smi when it is certain.

    Does not start TensorFlow's runtime (`list_physical_devices` does not).
    """
    import tensorflow as tf

    n = len(tf.config.list_physical_devices("GPU"))
    return inventory(n, query_smi(), os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))


def host_memory_mb() -> int | None:
    """The machine's physical memory in MB (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        return None
