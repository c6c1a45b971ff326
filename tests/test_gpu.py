"""Tests that need a real GPU (`python -m pytest -m gpu`); skipped, with the reason, without one.

Each case runs in a fresh process (`tests/gpu_cases.py`, or the memory benchmark's worker):
logical GPUs can be configured only before TensorFlow's runtime starts, and this process
started it in conftest. What they cover, which logical CPUs cannot show: every op of a stage
on its GPU and copies between GPUs, a card split into logical GPUs with their own memory limits
and allocators, each stage's peak memory from its GPU's allocator, mixed precision with XLA on
GPU kernels against float32, and recomputation lowering a GPU's measured peak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from compare import norm_rel_diff

GPUS = tf.config.list_physical_devices("GPU")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS, reason="needs a GPU: TensorFlow lists no physical GPU on this machine"),
]
UNIT_ROUNDOFF = {"mixed_bfloat16": 2.0**-8, "mixed_float16": 2.0**-11}


def fresh(cwd, *args: str, timeout: int = 600) -> dict:
    """Run `args` (a Python script and its arguments) in a fresh process in `cwd`; its last output line as JSON."""
    r = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def case(tmp_path, name: str) -> dict:
    return fresh(tmp_path, os.path.join(HERE, "gpu_cases.py"), name)


def test_each_stage_runs_on_its_own_gpu_and_only_copies_cross_between_them(tmp_path):
    got = case(tmp_path, "placement")
    assert all("GPU" in d for d in got["devices"]) and len(set(got["devices"])) == 2, got["devices"]
    assert got["misplaced"] == []
    assert got["crossings"] > 0 and got["foreign"] == []


def test_a_card_split_by_memory_limit_mb_gives_logical_gpus_with_their_own_limits_and_allocators(tmp_path):
    got = case(tmp_path, "virtual")
    assert got["logical"] == 2 and got["limits"] == [256, 512]
    gpu0, gpu1 = got["peaks"]
    assert gpu1 >= 64 << 20 and gpu0 < 64 << 20  # the tensor counted on its own logical GPU only
    assert got["over"] == "refused"  # 400 MiB does not fit GPU:0's 256 MiB (tensorflow #85026 reported otherwise)


def test_each_stages_peak_memory_is_its_gpus_own(tmp_path):
    got = case(tmp_path, "peaks")
    assert got["scope"] == "device"
    for s in got["stages"]:
        assert isinstance(s["peak"], int) and s["peak"] >= 4 * s["params"], s  # at least its float32 weights


def test_mixed_precision_with_xla_on_gpu_trains_like_float32_within_its_rounding(tmp_path):
    got = case(tmp_path, "precision")
    ref = got["float32"]
    for name, u in UNIT_ROUNDOFF.items():
        run = got[name]
        assert np.max(np.abs(np.array(run["losses"]) - ref["losses"]) / np.abs(ref["losses"])) <= 2 * u, name
        for k, (w, r, w0) in enumerate(zip(run["final"], ref["final"], ref["initial"])):
            w, r, w0 = np.array(w), np.array(r), np.array(w0)
            assert norm_rel_diff(w, r) <= 2 * u, (name, k)
            assert np.linalg.norm(r - w0) > 4 * u * np.linalg.norm(r), (name, k)  # training moved beyond it
            assert not np.array_equal(w, r), (name, k)  # the low precision really ran


def test_recompute_lowers_each_gpus_measured_peak(tmp_path):
    devices = "[" + ",".join(f"/GPU:{k}" for k in range(2)) + "]" if len(GPUS) >= 2 else None
    extra = [f"--extra=placement.devices={devices}"] if devices else ["--extra=placement.memory_limit_mb=[2048,2048]"]
    peaks = {}
    for policy in ("never", "always"):
        got = fresh(
            tmp_path,
            os.path.join(ROOT, "scripts", "bench_pipeline_memory.py"),
            "--worker",
            "--schedule=gpipe",
            f"--recompute={policy}",
            "--stages=2",
            "--width=1024",
            "--depth=4",
            "--features=64",
            "--batch=4096",
            "--warmup=2",
            "--steps=2",
            *extra,
        )
        peaks[policy] = got["stage_peaks"]
    for k, (never, always) in enumerate(zip(peaks["never"], peaks["always"])):
        assert always < 0.8 * never, (k, peaks)
