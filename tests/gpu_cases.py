"""The GPU tests' cases, each run in a fresh process: `python tests/gpu_cases.py CASE` prints
one JSON line with what `tests/test_gpu.py` checks.

A fresh process because logical GPUs (a card split by `placement.memory_limit_mb`) can be
configured only before TensorFlow's runtime starts, and pytest's own process has started it
(conftest). Each case builds its chain with `chain.build`, so the planner does the split.
`--kind CPU` runs a case on logical CPUs instead (a smoke check of the case's code on a
machine without a GPU; the GPU-only properties then do not hold).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MIB = 1 << 20
# A 2-stage e2e chain, small enough for any card.
BASE = [
    "+stages=2",
    "mode=e2e",
    "model.depth=2",
    "model.width=64",
    "optim=sgd",
    "optim.lr=0.1",
    "data=synthetic",
    "data.features=16",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=32",
    "data.shuffle=false",
    "trainer.progress=false",
    "pipeline.microbatches=2",
]


def _devices(kind: str) -> list[str]:
    return [] if kind == "GPU" else ["placement.devices=[/device:CPU:0,/device:CPU:1]"]


def assignment(kind: str) -> dict:
    """The planner's stage devices, and the step's graph audited: ops of stage k on device k, the
    copies the only ops that cross."""
    import chain
    from graph_audit import audit

    run = chain.build(chain.compose(BASE + _devices(kind)))
    x, ys = next(iter(run.batches()))
    a = audit(run.trace(x, ys))
    devices = [s.device for s in run.stages]
    crossings = a.crossings()
    return {
        "devices": devices,
        "misplaced": [str(op.name) for op in a.misplaced(devices)],
        "crossings": len(crossings),
        "foreign": [c.name for c, _ in crossings if not c.name.split("/")[-1].startswith("copy_to_")],
    }


def virtual(kind: str) -> dict:
    """One card split into two logical GPUs of 256 and 512 MiB: their configuration, and each one's
    own allocator (a tensor on GPU:1 counts on GPU:1 only; one above GPU:0's limit fails there)."""
    import chain
    import tensorflow as tf
    from chain.planning import memory

    chain.build(chain.compose(BASE + ["placement.visible=[0]", "placement.memory_limit_mb=[256,512]"]))
    card = tf.config.list_physical_devices("GPU")[0]
    limits = [c.memory_limit for c in tf.config.get_logical_device_configuration(card)]
    memory.reset(["/device:GPU:0", "/device:GPU:1"])
    with tf.device("/device:GPU:1"):
        big = tf.random.normal([64 * MIB // 4]) + 1.0
    float(tf.reduce_sum(big))
    peaks = [memory.peak_bytes("/device:GPU:0"), memory.peak_bytes("/device:GPU:1")]
    over = None
    try:
        with tf.device("/device:GPU:0"):
            huge = tf.random.normal([400 * MIB // 4]) + 1.0
        float(tf.reduce_sum(huge))
        over = "allocated"
    except tf.errors.ResourceExhaustedError:
        over = "refused"
    return {"logical": len(tf.config.list_logical_devices("GPU")), "limits": limits, "peaks": peaks, "over": over}


def peaks(kind: str) -> dict:
    """A few steps through the loop: summary.json's fields for each stage's peak memory."""
    import chain
    from chain.planning import memory

    run = chain.build(chain.compose(BASE + _devices(kind) + ["trainer.steps=3", "checkpoint.export=false"]))
    summary = run.fit()
    return {
        "scope": memory.scope(run.stages[0].device),
        "stages": [
            {"device": s["device"], "peak": s["peak_memory_bytes"], "params": s["params"]} for s in summary["stages"]
        ],
    }


def precision(kind: str) -> dict:
    """float32, mixed_float16 and mixed_bfloat16 (both with XLA) trained 5 steps on the same
    batches from the same weights: each stage's weights as one vector after each, and the losses."""
    import chain
    import numpy as np
    from compare import stage_vectors

    out = {}
    for name, extra in {
        "float32": [],
        "mixed_float16": ["precision=mixed_float16", "trainer.jit_compile=true"],
        "mixed_bfloat16": ["precision=mixed_bfloat16", "trainer.jit_compile=true"],
    }.items():
        run = chain.build(chain.compose(BASE + _devices(kind) + ["model.activation=tanh"] + extra))
        initial = stage_vectors(run)
        it = iter(run.batches())
        losses = [run.step(*next(it))["loss"] for _ in range(5)]
        out[name] = {
            "losses": losses,
            "initial": [v.tolist() for v in initial],
            "final": [v.tolist() for v in stage_vectors(run)],
        }
        del run
    assert all(np.array_equal(np.array(out[n]["initial"][0]), np.array(out["float32"]["initial"][0])) for n in out)
    return out


CASES = {"placement": assignment, "virtual": virtual, "peaks": peaks, "precision": precision}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--kind", choices=("GPU", "CPU"), default="GPU")
    a = p.parse_args()
    if a.kind == "CPU":
        import tensorflow as tf

        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    print(json.dumps(CASES[a.case](a.kind)))


if __name__ == "__main__":
    main()
