"""A regular (non-editable) install finds its packaged configs from any directory."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_runs_from_another_directory(tmp_path):
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("chain-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "chain").rglob("*.py")}
    assert sources <= shipped, sorted(sources - shipped)  # every module of every subpackage travels
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    env = dict(os.environ, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2")
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import chain, chain.config as c; print(chain.__file__); print(c.group_options('model'))",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.splitlines() == [
        str(target / "chain" / "__init__.py"),
        "['builder', 'conv', 'gpt', 'keras', 'mlp']",
    ], where.stderr
    r = subprocess.run(
        [sys.executable, "-m", "chain", "+stages=2", "trainer.steps=3", "data=synthetic"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert list(elsewhere.glob("outputs/*/*/summary.json"))
