"""The Python API in a notebook's order: `chain.setup` first, a Keras model made before `chain.build`,
a second build in the same process; and the one line a build gets when TensorFlow started too early.

Logical devices are fixed once per process, and this test session's are (conftest.py): every case
runs a script in a fresh interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from chain.planning.devices import TOO_LATE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "python-api.md")

# What the page's script leaves behind, checked in its own process after its last line.
AFTER_THE_PAGE = '''
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
try:
    chain.build(chain.compose(["+stages=5"]))
except chain.DeviceError as e:
    print("REFUSED", e)
else:
    raise AssertionError("a fifth stage was placed on one of four devices")
'''


def python_blocks(path: str) -> str:
    """Every fenced python block of a docs page, in order, as one script."""
    with open(path) as f:
        return "\n".join(re.findall(r"```python\n(.*?)```", f.read(), re.S))


def run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "notebook.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def test_the_python_api_page_runs_top_to_bottom_a_keras_model_made_first_trains(tmp_path):
    """docs/python-api.md as one script: setup, a chain built and trained, a Keras model made and then
    cut and trained, a second chain of 4 stages; then a 2-stage chain reuses the devices and a 5-stage
    one is refused in one line."""
    done = run_script(tmp_path, python_blocks(PAGE) + AFTER_THE_PAGE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED ")]
    assert refused == ["REFUSED stage 4 needs /device:CPU:4, which does not exist; available: "
                       + ", ".join(f"/device:CPU:{k}" for k in range(4)) + f"; {TOO_LATE}"]
    # The page shows that line as it is.
    with open(PAGE) as f:
        assert "chain.errors.DeviceError: " + refused[0][len("REFUSED "):] in f.read()


def test_a_model_made_before_any_setup_gets_one_line_under_the_users_call(tmp_path):
    """No `chain.setup`: the model starts TensorFlow with one CPU device; `chain.build` raises a
    DeviceError of one line saying what to do, and its traceback is the script's call and chain's
    entry point only."""
    done = run_script(tmp_path, "import keras\nimport chain\n"
                                "cfg = chain.compose(['+stages=3'])\n"
                                "model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), "
                                "keras.layers.Dense(8), keras.layers.Dense(8), keras.layers.Dense(10)])\n"
                                "chain.build(cfg, model=model)\n")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == ("chain.errors.DeviceError: stage 1 needs /device:CPU:1, which does not exist; available: "
                         f"/device:CPU:0; {TOO_LATE}")
    frames = re.findall(r'^  File "([^"]+)"', done.stderr, re.M)
    assert frames == [str(tmp_path / "notebook.py"), os.path.join(ROOT, "chain", "__init__.py")]
