"""The Python API in a notebook's order: `chain.setup` first, a Keras model made before `chain.build`,
a second build in the same process; a Keras model made with no `chain.setup` at all, its stages sharing the
one CPU device; and the one line a build gets when it names devices TensorFlow started too early to make.

Logical devices are fixed once per process, and this test session's are (conftest.py): every notebook
runs as a script in a fresh interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess

from chain.planning.devices import TOO_LATE
from conftest import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "python-api.md")

# What the page's script leaves behind, checked in its own process after its last line.
AFTER_THE_PAGE = """
import json, os
assert [s.device for s in run.stages] == [f"/device:CPU:{k}" for k in range(4)], run.stages
assert abs(run.timeline().bubble_fraction - 3 / 11) < 1e-12
assert summary["steps"] == 20 and summary["loss_last"] < summary["loss_first"], summary  # the user's model trained
assert [s["device"] for s in summary["stages"]] == [f"/device:CPU:{k}" for k in range(3)], summary["stages"]
assert all("sequential" in s["model"] for s in summary["stages"]), summary["stages"]
with open(os.path.join("out", "summary.json")) as f:
    assert json.load(f)["steps"] == 20
small = chain.build(chain.compose(["+stages=2", "trainer.steps=2"]))  # fewer stages: the devices set up, reused
assert [s.device for s in small.stages] == ["/device:CPU:0", "/device:CPU:1"]
more = chain.build(chain.compose(["+stages=5"]))  # more stages than devices: neighbours share them
assert [s.device for s in more.stages] == [f"/device:CPU:{k}" for k in (0, 0, 1, 2, 3)]
assert "the 5 stages share the 4 devices that exist" in more.notes[-1], more.notes
try:
    chain.build(chain.compose(["+stages=5", "placement.devices=[/CPU:0,/CPU:1,/CPU:2,/CPU:3,/CPU:4]"]))
except chain.DeviceError as e:
    print("REFUSED", e)
else:
    raise AssertionError("a device placement.devices names, which does not exist, was replaced")
"""

# A notebook without chain.setup: a Keras model made first (TensorFlow's runtime starts with /device:CPU:0 alone),
# then a 2-stage pipeline of it trained; its start and end weights saved for this process to compare; then a build
# naming a second device, whose one-line error ends the script.
NO_SETUP = """
import keras, numpy as np
import chain
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
np.savez("start.npz", *model.get_weights())
run = chain.build(chain.compose(ARGS), model=model)
assert [s.device for s in run.stages] == ["/device:CPU:0"] * 2, run.stages
run.fit()
np.savez("end.npz", *[v.numpy() for s in run.stages for v in s.trainable_variables])
chain.build(chain.compose(["+stages=2", "placement.devices=[/CPU:0,/CPU:1]"]))
"""
NO_SETUP_ARGS = [
    "+stages=2",
    "mode=e2e",
    "pipeline.microbatches=2",
    "data.batch_size=16",
    "trainer.steps=3",
    "trainer.progress=false",
    "checkpoint.export=false",
]
SHARED_NOTE = (
    "note: TensorFlow's runtime had started before chain could split the CPU into 2 logical devices (a model or "
    "tensor made first, or an earlier build): the 2 stages share /device:CPU:0 instead; chain.setup(cfg) first "
    "would have made them, and on a CPU they split nothing: logical CPU devices share one thread pool"
)


def python_blocks(path: str) -> str:
    """Every fenced python block of a docs page, in order, as one script."""
    with open(path) as f:
        return "\n".join(re.findall(r"```python\n(.*?)```", f.read(), re.S))


def run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    """`text` as `tmp_path/notebook.py`, run as `python -m notebook` from the test zygote: a process of its
    own whose TensorFlow runtime has not started (only the heavy imports are shared)."""
    (tmp_path / "notebook.py").write_text(text)
    return run_cli(tmp_path, module="notebook", timeout=600)


def test_the_python_api_page_runs_top_to_bottom_a_keras_model_made_first_trains(tmp_path):
    """docs/python-api.md as one script: setup, a chain built and trained, a Keras model made and then
    cut and trained, a second chain of 4 stages; then a 2-stage chain reuses the devices, a 5-stage one
    shares them, and one naming a fifth device in placement.devices is refused in one line."""
    done = run_script(tmp_path, python_blocks(PAGE) + AFTER_THE_PAGE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED ")]
    assert refused == [
        "REFUSED placement.devices[4]='/CPU:4' does not exist; available: "
        + ", ".join(f"/device:CPU:{k}" for k in range(4))
        + f"; {TOO_LATE}"
    ]
    # The page shows that line as it is.
    with open(PAGE) as f:
        assert "chain.errors.DeviceError: " + refused[0][len("REFUSED ") :] in f.read()


def test_a_model_made_before_any_setup_trains_its_stages_on_the_one_cpu_device_like_a_setup_run(tmp_path):
    """No `chain.setup`: the model starts TensorFlow with one CPU device; `chain.build(cfg, model=...)` puts
    both stages of a mode=e2e pipeline on it, prints the note on stderr, and trains bit for bit as the same
    run after chain.setup, a device per stage (this session's CPU:0 and CPU:1). A build naming a
    second device then gets one DeviceError line, its traceback the script's call and chain's entry point."""
    import keras
    import numpy as np

    import chain
    from compare import weights

    done = run_script(tmp_path, NO_SETUP.replace("ARGS", repr(NO_SETUP_ARGS)))
    assert done.returncode == 1, done.stderr[-3000:]
    assert SHARED_NOTE in done.stderr.splitlines()
    with open(PAGE) as f:  # the page shows that note as it is
        assert SHARED_NOTE in f.read().splitlines()
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"chain.errors.DeviceError: placement.devices[1]='/CPU:1' does not exist; available: /device:CPU:0; {TOO_LATE}"
    )
    frames = re.findall(r'^  File "([^"]+)"', done.stderr, re.M)  # the zygote's and runpy's frames, then these
    assert frames[-2:] == [str(tmp_path / "notebook.py"), os.path.join(ROOT, "chain", "__init__.py")], frames

    cfg = chain.compose(NO_SETUP_ARGS)
    chain.setup(cfg)  # (this session's devices are split already, conftest.py: the setup keeps them)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    with np.load(tmp_path / "start.npz") as start:
        model.set_weights([start[f"arr_{k}"] for k in range(len(start.files))])
    run = chain.build(cfg, model=model)
    assert [s.device for s in run.stages] == ["/device:CPU:0", "/device:CPU:1"]
    run.fit()
    with np.load(tmp_path / "end.npz") as end:
        shared = [end[f"arr_{k}"] for k in range(len(end.files))]
    mine = weights(run)
    assert len(shared) == len(mine) == 6
    for a, b in zip(shared, mine):
        np.testing.assert_array_equal(a, b)
