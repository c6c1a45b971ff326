"""The documented examples run as written: each command of an `examples` block (in README.md or a
page of docs/; today docs/your-models.md), in a fresh directory (with the repository's examples/
beside it), exits 0 and trains."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_examples() -> list[str]:
    blocks = [
        block
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for block in re.findall(r"<!-- examples -->\n```bash\n(.*?)```\n<!-- /examples -->", page.read_text(), re.S)
    ]
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_has_the_two_examples():
    commands = readme_examples()
    assert len(commands) == 2 and "digits_nets" in commands[0] and "model=keras" in commands[1]


@pytest.mark.parametrize("command", readme_examples(), ids=["builders", "cut-keras-model"])
def test_a_readme_example_runs_as_written(tmp_path, command):
    os.symlink(ROOT / "examples", tmp_path / "examples")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (summary,) = glob.glob(str(tmp_path / "outputs" / "*" / "*" / "summary.json"))
    s = json.load(open(summary))
    assert s["mode"] == "e2e" and s["loss_last"] < s["loss_first"]
    assert all(st["variable_devices"] == [st["device"]] for st in s["stages"])
