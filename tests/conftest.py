"""Test session set-up: 4 logical CPU devices, configured before TensorFlow's runtime starts.

Logical devices can be set once per process, so in-process tests share these four and
CLI cases run as separate processes (see `run_cli`: forked from `tests/zygote.py`). They are
set the moment something first imports TensorFlow (a test module, or chain's modules it imports),
so a test that needs no TensorFlow runs in a process that never starts it.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import glob
import importlib.abc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # peak memory on any CPU, as the CLI does (chain.cli)

import pytest  # noqa: E402

N_DEVICES = 4
DEVICES = [f"/device:CPU:{k}" for k in range(N_DEVICES)]


def _set_devices(tf) -> None:
    """This process's four logical CPU devices, set on `tf` (just imported, its runtime not started)."""
    # On a GPU host this process must not take every card's memory when its runtime starts: the
    # GPU tests (tests/test_gpu.py) run their cases in fresh processes on the same cards.
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * N_DEVICES
    )
    # Start the runtime now, so these four stay whatever a test builds first: otherwise the
    # first `chain.build` (still before the runtime) would re-split the CPU to its own plan.
    assert len(tf.config.list_logical_devices("CPU")) == N_DEVICES


class _DevicesOnImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` for its first import and sets the devices (`_set_devices`) once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once, and so that the search below finds the real one
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def run_then_set(module) -> None:
            run(module)
            _set_devices(module)

        spec.loader.exec_module = run_then_set
        return spec


if "tensorflow" in sys.modules:  # a plugin imported it before this file
    _set_devices(sys.modules["tensorflow"])
else:
    sys.meta_path.insert(0, _DevicesOnImport())


# Cases another test covers in kind, run with CHAIN_TEST_ZOO=all as the keras_hub zoo's rest: the suite's
# 15 minutes cannot carry every combination (README.md and docs/your-models.md list them).
EXTENDED = pytest.mark.skipif(
    os.environ.get("CHAIN_TEST_ZOO") != "all", reason="an extended case: runs with CHAIN_TEST_ZOO=all (README.md)"
)


def run_cli(
    cwd, *overrides: str, module: str = "chain", timeout: int = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m chain OVERRIDES` in `cwd` (a fresh process: its own logical devices).

    `env` adds environment variables (e.g. the fault-injection hooks of `chain.testhooks`).
    The process is forked from `tests/zygote.py`, which has the heavy imports done (set
    CHAIN_TEST_NO_ZYGOTE=1 to start each from scratch instead).
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    if os.environ.get("CHAIN_TEST_NO_ZYGOTE"):
        return subprocess.run(
            [sys.executable, "-m", module, *overrides],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    return _zygote().run(list(overrides), module, str(cwd), env, timeout)


class _Zygote:
    """The client of this test process's `tests/zygote.py` (one command line at a time)."""

    def __init__(self):
        read, write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "zygote.py"), str(write)],
            stdin=subprocess.PIPE,
            pass_fds=(write,),
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        os.close(write)
        self.answers, self.pending = read, b""

    def _answer(self, timeout: float | None) -> dict | None:
        """The next JSON line from the zygote, or None if none came within `timeout` seconds."""
        import select

        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.answers], [], [], left)[0]:
                return None
            chunk = os.read(self.answers, 65536)
            if not chunk:
                raise RuntimeError(f"the test zygote ended (exit {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], module: str, cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
        import tempfile

        args = [sys.executable, "-m", module, *argv]
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, "out"), os.path.join(d, "err")
            self.proc.stdin.write(
                json.dumps({"argv": argv, "module": module, "cwd": cwd, "env": env, "out": out, "err": err}) + "\n"
            )
            self.proc.stdin.flush()
            pid = self._answer(60)["pid"]
            done = self._answer(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._answer(None)
            with open(out, errors="replace") as f, open(err, errors="replace") as g:
                stdout, stderr = f.read(), g.read()
        if done is None:
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, done["status"], stdout, stderr)


@functools.cache
def _zygote() -> _Zygote:
    """This test process's one zygote, started on first use."""
    return _Zygote()


def run_dirs(cwd) -> list[str]:
    """Run directories Hydra created under `cwd/outputs`."""
    return sorted(glob.glob(os.path.join(str(cwd), "outputs", "*", "*")))


def read_summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def manifest(run_dir) -> dict:
    with open(os.path.join(run_dir, "checkpoint.json")) as f:
        return json.load(f)


def straight_and_resumed(
    tmp_path, args: list[str], every: int, kill_at: int, env: dict | None = None, before_resume=None
) -> tuple[str, str]:
    """Two runs of `python -m chain ARGS` (a checkpoint every `every` steps): one straight through, one
    killed at step `kill_at` (after its checkpoint of step `every`) and resumed; their run directories.
    `env` adds environment variables to the first two runs; `before_resume()`, if given, runs after the
    kill and returns the resume's."""
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = run_cli(tmp_path, *args, f"hydra.run.dir={straight}", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli(
        tmp_path, *args, f"hydra.run.dir={resumed}", env={**(env or {}), "CHAIN_TEST_KILL_AT_STEP": str(kill_at)}
    )
    assert r.returncode == -9, r.stderr
    assert manifest(resumed)["step"] == every
    r = run_cli(
        tmp_path,
        *args,
        f"hydra.run.dir={resumed}",
        "resume=true",
        env=before_resume() if before_resume is not None else env,
    )
    assert r.returncode == 0, r.stderr
    return straight, resumed


def stage_values(run_dir, stage: str) -> dict:
    """Every variable of one stage's newest complete checkpoint, by checkpoint key (its identity,
    which names the run that wrote it, left out: two runs compare by what they computed)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(run_dir, manifest(run_dir)["checkpoints"][stage]))
    return {
        k: reader.get_tensor(k)
        for k in reader.get_variable_to_shape_map()
        if k != "_CHECKPOINTABLE_OBJECT_GRAPH" and not k.startswith("identity/")
    }


@contextlib.contextmanager
def paused_in_save(cwd, run_dir, *overrides: str, step: int):
    """A `python -m chain OVERRIDES` run (checkpoint.every must reach `step`) that stalls 120 s
    in its save of `step`, right after stage 0 is written, holding its directory; yields the
    process, killed on exit (fault hook: `chain.testhooks`)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHAIN_TEST_SAVE_PAUSE=f"120@{step}")
    live = subprocess.Popen(
        [sys.executable, "-m", "chain", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in live.stderr:
            if f"test-hook: saved stage_00 of step {step}" in line:
                break
        else:
            pytest.fail("the live run never reached its save")
        yield live
    finally:
        live.kill()
        live.wait()


@pytest.fixture
def cli(tmp_path):
    """`cli(*overrides)` runs the command line in a fresh directory."""
    return lambda *overrides, **kw: run_cli(tmp_path, *overrides, **kw)


# The modules that take longest (20 s or more), longest first, as measured per test on a fresh
# clone's run (kill-and-resume loops, cluster workers, many CLI processes). With `-n 3 --dist
# loadfile --no-loadscope-reorder` (the README's command) a worker takes whole modules in
# collection order, so starting with these keeps one of them from running alone on one core
# after the other workers have finished.
LONGEST_FIRST = [
    "test_cluster.py",
    "test_keras_hub.py",
    "test_quiet.py",
    "test_doc_examples.py",
    "test_resume_layout.py",
    "test_profile.py",
    "test_cli_faults.py",
    "test_structured_cuts.py",
    "test_multi_worker.py",
    "test_recipes.py",
    "test_stress.py",
    "test_side_by_side.py",
    "test_applications.py",
    "test_gpt.py",
    "test_regularization.py",
    "test_streaming.py",
    "test_resume.py",
    "test_steps_per_call.py",
    "test_pipeline.py",
    "test_resume_settings.py",
    "test_varlen.py",
    "test_bench_lm.py",
    "test_run_dir.py",
    "test_token_data.py",
    "test_restage.py",
    "test_user_models.py",
    "test_precision.py",
    "test_examples.py",
    "test_schedulers.py",
    "test_cut_models.py",
    "test_speed_cli.py",
    "test_auto_plan.py",
    "test_shared_weights.py",
    "test_token_loss.py",
    "test_stall.py",
]


def pytest_configure(config):
    # Every CLI case starts a Python process; where PYTHONDONTWRITEBYTECODE is set (this machine's image does)
    # each would compile chain's modules again (about 0.5 s of CPU). Compiled once here, they are read.
    if not hasattr(config, "workerinput"):  # the xdist controller (or a plain run), before any worker
        compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(__file__)), "chain"), quiet=1)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a module and among the rest is kept
