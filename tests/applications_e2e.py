"""Run by tests/test_applications.py in a fresh process: a keras.applications model cut into
stages, trained in mode=e2e, against the same model trained by a one-device tape loop on the
same batches. Grappler off in this process (`disable_meta_optimizer`, /work/shared/TRAPS.md:
it rewrites one whole-model graph and per-stage graphs differently, and these models amplify
1e-7 to 150% in 3 steps), so both compute the same ops: the weights must be bit-equal.

usage: python applications_e2e.py MODEL STAGES BALANCE DATA.npz STEPS -> prints one JSON line
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4
)
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

import keras  # noqa: E402
import numpy as np  # noqa: E402

import chain  # noqa: E402
from compare import sgd_step  # noqa: E402  (this file's folder is on sys.path)


def make(name: str) -> keras.Model:
    keras.utils.set_random_seed(7)
    return getattr(keras.applications, name)(
        weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None
    )


def main(name: str, stages: int, how: str, data: str, steps: int) -> dict:
    run = chain.build(
        chain.compose(
            [
                f"+stages={stages}",
                "mode=e2e",
                f"placement.balance={how}",
                "optim=sgd",
                "optim.lr=0.05",
                "pipeline.microbatches=1",
                "data=npz",
                f"data.path={data}",
                "data.y=y",
                "data.batch_size=8",
                "data.shuffle=false",
                "trainer.progress=false",
                "checkpoint.export=false",
            ]
        ),
        model=make(name),
    )
    reference = make(name)
    ref_step = sgd_step(reference, "/device:CPU:3", 0.05)
    start = [v.numpy() for v in reference.trainable_variables]
    losses = []
    it = iter(run.batches())
    for _ in range(steps):
        x, ys = next(it)
        losses.append((float(run.step(x, ys)["loss"]), float(ref_step(x, ys["label"]))))
    chained = [v for s in run.stages for v in s.model.trainable_variables]
    pairs = list(zip(chained, reference.trainable_variables, start, strict=True))
    moving = {
        "chained": [v for s in run.stages for v in s.model.non_trainable_variables],
        "reference": reference.non_trainable_variables,
    }
    return {
        "sizes": [len(s.model.layers) - 1 for s in run.stages],
        "losses": losses,
        "variables": len(pairs),
        "unequal": [r.path for w, r, _ in pairs if not np.array_equal(w.numpy(), r.numpy())],
        "moved": sum(not np.array_equal(r.numpy(), w0) for _, r, w0 in pairs),
        "unequal_statistics": [
            r.path
            for w, r in zip(moving["chained"], moving["reference"], strict=True)
            if not np.array_equal(w.numpy(), r.numpy())
        ],
    }


if __name__ == "__main__":
    name, stages, how, data, steps = sys.argv[1:]
    print(json.dumps(main(name, int(stages), how, data, int(steps))))
