"""Peak memory per device, as far as TensorFlow can report it.

`tf.config.experimental.get_memory_info(device)` reads the device allocator's
statistics. A GPU (also a logical GPU cut from one card) has its own allocator, so its
figure is that device's. All logical CPU devices of a process share one allocator, so
on CPU every device reports the same, process-wide figure. Where a device cannot report
(an allocator without statistics), the figure is None.
"""

from __future__ import annotations

from typing import Sequence


def _name(device: str) -> str:
    # get_memory_info wants "GPU:0"/"CPU:1", not "/device:GPU:0".
    return device.rsplit("device:", 1)[-1].lstrip("/")


def reset(devices: Sequence[str]) -> None:
    """Start a new peak for each device that keeps statistics (the rest are skipped)."""
    import tensorflow as tf

    for d in sorted(set(devices)):
        try:
            tf.config.experimental.reset_memory_stats(_name(d))
        except (ValueError, RuntimeError, tf.errors.OpError):
            pass


def peak_bytes(device: str) -> int | None:
    """The device allocator's peak since the last `reset`, in bytes; None if it cannot say."""
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(_name(device))["peak"])
    except (ValueError, RuntimeError, KeyError, tf.errors.OpError):
        return None


def scope(device: str) -> str:
    """What `peak_bytes(device)` measures: "device" (a GPU's own allocator) or "process" (CPU)."""
    return "process" if "CPU" in device.upper() else "device"
