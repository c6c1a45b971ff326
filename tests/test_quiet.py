"""The console says only what matters: TensorFlow's start-up banner and its known harmless lines (Grappler's
`layout failed` under trainer.grad_accum, a mirrored step's `Reduce to ... then broadcast to` INFO lines, the
checkpoint saver's retracing warning on cluster workers) and other libraries' log lines (matplotlib's font cache
on a fresh machine) reach neither stream, from the command line (training, with data.tokenizer too, the report,
restage, generate), the Python API (`chain.setup`, `chain.build`) or an example, each started as a user starts
it (TF_CPP_MIN_LOG_LEVEL not set); TensorFlow's own error text still reaches chain's error line. The command
lines' own lines: generate's Ctrl-C (the text so far, then one line) and its refusal of a run still training;
the report of a run whose name holds `$...$` (drawn and written as it is)."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chain.state import lock
from chain.worker import LocalCluster
from conftest import EXTENDED, run_cli

ROOT = Path(__file__).resolve().parents[1]
TINY = ["+stages=2", "model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]
# absl's C++ lines (I0000/W0000/E0000 ...), its pre-init notice, Python's tensorflow logger (its own format and Hydra's),
# any other library's logger (Hydra's format `[time][name][LEVEL]`, Python's `LEVEL:name:`)
FOREIGN = re.compile(
    r"^[IWEF]\d{4} |absl::InitializeLog|WARNING:tensorflow|\[tensorflow\]|oneDNN|cpu_feature_guard|"
    r"cuInit|topological order|then broadcast to|retracing|"
    r"^\[[^]]*\]\[(?!chain\])[^]]*\]\[|^(DEBUG|INFO|WARNING|ERROR|CRITICAL):(?!chain:)",
    re.M,
)
# A tiny byte-level language model (model=gpt on data=text)
LM = [
    "mode=e2e",
    "model=gpt",
    "data=text",
    "data.path=corpus.txt",
    "data.seq_len=8",
    "data.batch_size=8",
    "model.width=8",
    "model.heads=2",
    "model.depth=1",
    "+stages=2",
    "trainer.steps=1",
    "trainer.progress=false",
]
TOKENIZER = ["[PAD]", "[UNK]", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", ";", ","]


def as_a_user(*args: str, cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    """A fresh `python ARGS` in `cwd` with TensorFlow's log level left to chain (not the test zygote's), and
    `env` added."""
    env = {**{k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def assert_quiet(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    for stream in (r.stdout, r.stderr):
        assert not FOREIGN.search(stream), stream


@EXTENDED  # the suite's time: the command line's quiet start runs every time
def test_grad_accum_the_python_api_and_the_example_start_and_train_quietly(tmp_path):
    r = as_a_user("-m", "chain", *TINY, "trainer.steps=2", "trainer.grad_accum=4", cwd=tmp_path)
    assert_quiet(r)
    assert r.stderr == ""
    api = (
        "import chain\n"
        f"cfg = chain.compose({[*TINY, 'trainer.steps=2', 'trainer.grad_accum=4']!r})\n"
        "chain.setup(cfg)\n"  # TensorFlow imported here first
        "print(chain.build(cfg).fit()['steps'])\n"
    )
    r = as_a_user("-c", api, cwd=tmp_path)
    assert_quiet(r)
    assert (r.stdout, r.stderr) == ("2\n", "")
    r = as_a_user(str(ROOT / "examples" / "make_digits_model.py"), "m.keras", cwd=tmp_path)
    assert_quiet(r)
    assert (r.stdout, r.stderr) == ("wrote m.keras\n", "")


@EXTENDED  # for the suite's time: the example's and the Python API's quiet runs run every time
def test_the_mirrored_fallback_and_a_resume_on_cluster_workers_print_no_tensorflow_lines(tmp_path):
    # Python's logging only: the test zygote's TensorFlow (its C++ log level set at its import) will do
    assert_quiet(run_cli(tmp_path, *TINY, "trainer.steps=2", "placement.fallback=mirrored"))
    with LocalCluster(2) as cluster:
        args = [
            *TINY,
            "mode=e2e",
            "pipeline.microbatches=2",
            "checkpoint.every=1",
            cluster.option,
            f"hydra.run.dir={tmp_path / 'cluster'}",
        ]
        assert run_cli(tmp_path, *args, "trainer.steps=1").returncode == 0  # the checkpoint to resume (not checked)
        # 3 more saves of 2 stages, each spanning the client and a worker: TensorFlow's saver retraces from the 5th
        assert_quiet(as_a_user("-m", "chain", *args, "trainer.steps=4", "resume=true", cwd=tmp_path))
        # a worker that cannot serve: TensorFlow's own words in chain's one line
        r = as_a_user("-m", "chain.worker", "--index", "0", "--cluster", cluster.addresses[0], cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: worker 0 cannot serve {cluster.addresses[0]}: "), r.stderr


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A language model's run (`run`, in the returned folder) trained by `python -m chain` with report=true on a
    fresh machine (matplotlib's cache folder empty), and what it printed."""
    cwd = tmp_path_factory.mktemp("lm")
    (cwd / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog; naïve café\n" * 40)
    r = as_a_user(
        "-m", "chain", *LM, "report=true", "hydra.run.dir=run", cwd=cwd, env={"MPLCONFIGDIR": str(cwd / "matplotlib")}
    )
    return cwd, r


@EXTENDED  # for the suite's time: the example's and the Python API's quiet runs run every time
def test_training_on_a_fresh_machine_with_a_tokenizer_and_restaging_print_only_chains_lines(lm, tmp_path):
    assert_quiet(lm[1])
    assert os.path.isfile(lm[0] / "run" / "report.html")
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog;\n" * 20)
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENIZER) + "\n")
    r = as_a_user(
        "-m",
        "chain",
        *LM,
        "data.tokenizer=vocab.txt",
        f"model.vocab={len(TOKENIZER)}",
        cwd=tmp_path,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # keras_hub imports TensorFlow in the preparation
    assert_quiet(r)
    assert r.stderr == ""
    assert run_cli(tmp_path, *TINY, "trainer.steps=2", "hydra.run.dir=src").returncode == 0
    r = as_a_user("-m", "chain.restage", "src", "dst", "+stages=1", cwd=tmp_path)
    assert_quiet(r)
    assert r.stderr == "" and r.stdout.startswith("restaged step 2: 2 stages -> 1 stage"), r.stdout


@EXTENDED  # the suite's time: the report's other quiet runs are every run
def test_the_report_of_a_run_named_with_dollars_shows_the_name_as_written(lm):
    name = r"$\frac{x}{y}$ & <i>$\frac{x$"  # two `$...$` pairs, the second no formula mathtext can parse
    shutil.copytree(lm[0] / "run", lm[0] / name)
    r = as_a_user("-m", "chain.report", name, cwd=lm[0], env={"MPLCONFIGDIR": str(lm[0] / "matplotlib")})
    assert_quiet(r)
    assert (r.stdout, r.stderr) == (f"report: {os.path.join(name, 'report.html')}\n", "")
    page = (lm[0] / name / "report.html").read_text()
    assert r"<h1>chain run $\frac{x}{y}$ &amp; &lt;i&gt;$\frac{x$</h1>" in page


def test_the_reports_figures_draw_text_as_written(monkeypatch):
    """No mathtext, nor LaTeX (the user's text.usetex), in any text a figure draws: a run's name, devices, tags."""
    import matplotlib
    from matplotlib.text import Text

    from chain.report import plots

    drawn, draw = [], Text.draw
    monkeypatch.setattr(Text, "draw", lambda self, renderer: drawn.append(self) or draw(self, renderer))
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    name = r"$\frac{x}{y}$ $\frac{x$"
    plots.curves({name: {"loss": [(1, 1.0), (2, 0.5)]}}, name)
    plots.gantt([[(0.0, 1.0, "F", name)]], [name], name, name)
    plots.bars([name], [1.0], name, name)
    named = [t for t in drawn if name in t.get_text()]
    assert len(named) >= 8  # title, legend; title, bar, tick, label; title, tick, label
    assert not [t.get_text() for t in drawn if t.get_parse_math() or t.get_usetex()]


@EXTENDED  # the suite's time: Ctrl-C's one line in training (test_cli_faults), generate's text (test_gpt) every time
def test_generate_stops_on_ctrl_c_in_one_line_after_the_text_so_far(lm):
    prompt = "the qu"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    p = subprocess.Popen(
        [sys.executable, "-m", "chain.generate", "run", "--prompt", prompt, "--tokens", "1000000000"],
        cwd=lm[0],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # not a background job's
    try:
        out, deadline = b"", time.monotonic() + 120
        while len(out) <= len(prompt):  # the prompt, then the first generated bytes
            if not select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                pytest.fail(f"no text within 120 s: {out!r}")
            chunk = os.read(p.stdout.fileno(), 4096)  # unbuffered: communicate() reads the same descriptor
            assert chunk, p.stderr.read()
            out += chunk
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        p.kill()
    text = (out + rest).decode()
    assert p.returncode == 130, err
    assert text.startswith(prompt) and text.endswith("\n") and text.count("\n") == 1
    made = re.fullmatch(rb"interrupted after (\d+) of 1000000000 bytes \(printed above\)\n", err)
    assert made and int(made.group(1)) >= 1, err


def test_generate_refuses_a_run_that_is_still_training_in_one_line(lm):
    run = str(lm[0] / "run")
    lock.acquire(run)  # this process: a run still training it
    try:
        r = run_cli(lm[0], "run", "--prompt", "the", module="chain.generate")
    finally:
        lock.release(run)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert re.fullmatch(
        rf"error: run is in use by a run that is still training \(pid {os.getpid()} on .*, since .*\); "
        r"try again after that run has ended\n",
        r.stderr,
    ), r.stderr
