"""Every example in README.md and docs/ is a test: each page's fenced `bash`, `python` and `text`
blocks, read when the test runs, are played in the page's order in one fresh directory (so a block
that makes a file serves the ones after it), with the repository's examples/ beside them.

- A `python -m chain ...` command of a `bash` block is planned (`plan_only=true` added: its overrides
  compose, its data and devices are checked and placed, nothing trains), unless RUN lists it (run as
  written) or SHORT does (run with SHORT's overrides appended: a few steps of a longer run).
- A line `NAME=$(COMMAND)` of a `bash` block sets a shell variable: bash runs it, and `$NAME` in the
  commands after it on the page stands for its value.
- A `text` block of `$ COMMAND` lines, each followed by what it prints, is a transcript: the command
  runs as written and its output (stdout, then stderr) must be those lines. In an expected line `...`
  stands for any text, and a line that is only `...` for any number of lines (dates, timings, paths).
- A `python` block runs as one script, in the page's directory.
- Everything else a block holds is listed below with the reason it is not run or compared (SKIP,
  SHOWN, TEXT); a command neither planned, run nor listed fails the test, and so does a list entry
  no page holds any more.

The `<!-- examples -->` blocks are run in full by tests/test_examples.py and skipped here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (page, a piece of the command or block) -> why it is not run here. A piece matches a command
# (continuation lines joined, comments dropped, as shlex quotes it), a transcript's `$ COMMAND`
# line, or any part of a python block.
SKIP = {
    ("language-models.md", "data.examples=lines 'data.buckets=[64,128,256]'"): "the reader's corpus/*.txt; "
    "tests/test_varlen.py trains on lines in buckets (the trace counts the page shows included)",
    ("language-models.md", "data.examples=lines data.pack=true"): "the reader's corpus/*.txt; tests/test_varlen.py "
    "trains packed windows against the examples unpacked",
    ("your-data.md", "model.path=encoder.keras data=tfrecord"): "the reader's encoder and TFRecord files; "
    "tests/test_varlen.py trains such a masked encoder on variable-length ids in buckets",
    ("your-data.md", "model.path=encoder.keras data=npz"): "the reader's encoder; tests/test_varlen.py streams "
    "ragged ids of an .npz bit for bit as the same examples in a TFRecord file and trains the encoder on them",
    ("your-data.md", "data.tokenizer=vocab.txt data.examples=lines"): "the reader's corpus and vocabulary; "
    "tests/test_varlen.py makes each line an example of the tokenizer's ids",
    ("language-models.md", "SegmentMask()(seg)"): "saves a model for the reader's corpus (below); tests/test_varlen.py "
    "builds such a model and trains it packed (CHAIN_TEST_ZOO=all)",
    ("checkpoints.md", "+stages=2 pipeline.schedule=gpipe pipeline.microbatches=4 trainer.steps=20"): "a 20-step run "
    "on the reader's text; tests/test_resume_layout.py trains and resumes such runs, the line included",
    ("checkpoints.md", "+stages=4 pipeline.schedule=zb1 pipeline.microbatches=8 trainer.steps=30"): "its resume "
    "on another layout (tests/test_resume_layout.py)",
    ("checkpoints.md", "+stages=4 model.depth=2 trainer.steps=100 hydra.run.dir=outputs/mlp-run"): "a 100-step run "
    "to resume on 2 stages; tests/test_restage.py resumes such a run's heads (chain.restage, the same restore)",
    ("checkpoints.md", "+stages=2 model.depth=4 trainer.steps=200 hydra.run.dir=outputs/mlp-run resume=true"): "its "
    "resume on 2 stages (tests/test_resume_layout.py: mode=e2e, bit for bit)",
    ("README.md", "python -m venv"): "makes a venv (the test runs in the installed checkout)",
    ("README.md", ". .venv/bin/activate"): "activates that venv",
    ("README.md", "pip install"): "installs the package (the test runs in the installed checkout)",
    ("README.md", "python -m pytest"): "runs the test suite itself",
    ("README.md", "cluster.workers=[hostA:2222,hostB:2222]"): "needs cluster workers on hostA and hostB",
    ("README.md", "model.path=digits_model.keras"): "the reader's .keras file; docs/your-models.md makes and runs it "
    "(tests/test_examples.py)",
    ("README.md", "hydra.run.dir=outputs/2026-11-29/09-25-31 resume=true"): "resumes a run the reader killed earlier",
    ("devices.md", "CUDA_VISIBLE_DEVICES=3,1"): "needs GPUs 1 and 3",
    ("devices.md", "pip install"): "installs the gpu extra (needs a CUDA host)",
    ("devices.md", "python -m pytest -m gpu"): "runs the GPU tests (needs a GPU)",
    ("checkpoints.md", "hydra.run.dir=outputs/2026-11-29/09-25-31 resume=true"): "resumes a run the reader killed at "
    "step 1234",
    ("checkpoints.md", "hydra.run.dir=outputs/... resume=true"): "resumes a run of the reader's (outputs/...)",
    ("cluster.md", "python -m chain.worker"): "a cluster worker serves until it is killed (tests/test_cluster.py)",
    ("cluster.md", "cluster.workers=[hostA:2222,hostB:2222]"): "needs cluster workers on hostA and hostB",
    ("cluster.md", "TF_CONFIG="): "one process of a two-host TF_CONFIG cluster: needs the other host",
    ("cluster.md", "python scripts/stress_lost.py"): "minutes of runs losing a worker (tests/test_stress.py runs it "
    "briefly, tests/test_cluster.py each case)",
    ("cluster.md", "srun python -m chain cluster.launcher=slurm"): "an sbatch script's srun line: played as three "
    "Slurm tasks on loopback by "
    "test_cluster_md_sbatch_script_runs_as_three_slurm_tasks",
    ("measuring.md", "python -m chain.worker"): "a cluster worker serves until it is killed (tests/test_profile.py)",
    ("measuring.md", "cluster.workers=[localhost:2222,localhost:2223]"): "needs the two workers the lines before start",
    ("measuring.md", "python -m chain.report outputs/2026-11-29"): "compares two runs of the reader's",
    ("measuring.md", "cluster.workers=[...]"): "needs the reader's cluster workers (elided: [...])",
    ("precision-and-speed.md", "python scripts/bench_"): "a benchmark: minutes of timing on quiet cores "
    "(docs/benchmarks.md)",
    ("benchmarks.md", "python scripts/bench_"): "a benchmark: minutes of timing on quiet cores",
    ("benchmarks.md", "python scripts/stress_"): "a stress run: minutes of kills and races (tests/test_stress.py runs "
    "both briefly)",
    ("benchmarks-history.md", "python scripts/bench_"): "a benchmark: minutes of timing on quiet cores",
    ("your-data.md", "data=keras data.name=fashion_mnist"): "reads fashion_mnist from the Keras cache, which chain "
    "never downloads (empty here)",
    ("your-data.md", "data._target_=mypackage.data.make_dataset"): "the reader's own package (mypackage)",
    ("your-data.md", "data.path=table.csv"): "the reader's own table.csv",
    ("your-data.md", "'data.path=records/*.tfrecord'"): "the reader's own TFRecord files",
    ("your-data.md", "'data.path=shards/train-*.tfrecord'"): "the reader's own TFRecord shards",
    ("your-data.md", "'data.path=tables/part-*.csv'"): "the reader's own CSV files",
    ("your-data.md", "'data.path=data/*.tfrecord'"): "the reader's own damaged TFRecord files",
    (
        "your-data.md",
        "$ python -m chain ... 'data.path=shards/*.tfrecord' hydra.run.dir=outputs/run resume=true",
    ): "a resume of the reader's run after a shard was removed (tests/test_stream_identity.py)",
    ("your-data.md", "$ python -m chain data=keras"): "names the home directory of the machine it ran on",
    ("your-models.md", "run = chain.build(cfg, stages=[build_encoder, build_head])"): "a fragment: cfg, the builders "
    "and the model are the reader's",
}


def digits_npz(cwd: Path) -> None:
    """train.npz as the README's data=npz example has it: the shipped digits as `images` and `labels`."""
    import numpy as np

    d = np.load(ROOT / "chain" / "data" / "sources" / "digits.npz")
    np.savez(cwd / "train.npz", images=d["images"].reshape(len(d["images"]), -1) / 16.0, labels=d["target"])


def small_tables(cwd: Path) -> None:
    """data/a.npz (arrays x, y, v) and data/a.csv (columns f1, f2, f3, label, value), the files
    your-data.md's error transcripts name."""
    import numpy as np

    (cwd / "data").mkdir()
    rng = np.random.default_rng(0)
    np.savez(cwd / "data" / "a.npz", x=rng.random((40, 3)), y=rng.integers(0, 2, 40), v=rng.random(40))
    rows = [f"{a:.3f},{b:.3f},{c:.3f},{k % 2},{a + b:.3f}" for k, (a, b, c) in enumerate(rng.random((40, 3)))]
    (cwd / "data" / "a.csv").write_text("f1,f2,f3,label,value\n" + "\n".join(rows) + "\n")


# The reader's own files a page's commands name, made before the page is played (the rest are in SKIP).
SETUP = {"README.md": digits_npz, "your-data.md": small_tables}

# Error lines a page shows without a command (a fault during a run): the test that asserts the message.
SHOWN = {
    ("checkpoints.md", "error: stage 1: loss or gradients are not finite"): "tests/test_checkpoints.py",
    ("cluster.md", "error: cluster worker 1 (localhost:40213) is lost"): "tests/test_cluster.py kills a worker; "
    "the line's form is compared below",
    ("cluster.md", "error: worker 0 stops: no word from its client"): "tests/test_schedulers.py kills a client (a "
    "2 s wait there) and compares the line",
    ("pipeline.md", "error: stage 0 needs about 195 MB on /device:GPU:0"): "needs a GPU; tests/test_planner.py",
    ("pipeline.md", "error: placement.plan=auto: no plan fits the devices' memory"): "logical GPUs with memory "
    "limits; tests/test_auto_plan.py",
    ("your-data.md", "error: data.path: record 9 of shards/train-001.tfrecord"): "tests/test_streaming.py",
    ("your-data.md", "error: data.path: a record cannot be read"): "tests/test_streaming.py",
    ("your-data.md", "error: data.path: line 12 of tables/part-0.csv"): "tests/test_streaming.py",
    ("measuring.md", "error: cluster.profile_ports[1]=2233"): "tests/test_cluster.py (a profile port that does "
    "not answer)",
    ("your-data.md", "error: data.path: shards/train-004.tfrecord holds no records"): "tests/test_damaged_data.py",
    ("your-data.md", "error: data.path: record 0 of shards/train-002.tfrecord"): "tests/test_damaged_data.py",
    ("your-data.md", "error: data.val_path='val.npz': its arrays hold no rows"): "tests/test_streaming.py",
    ("your-data.md", "error: data.path: record 25 of shards/train-001.tfrecord"): "tests/test_damaged_data.py",
    ("your-data.md", "error: data.path='u32.bin' looks like uint32 ids"): "tests/test_token_data.py",
    ("your-data.md", "error: data.path='u16.bin' read as data.dtype=uint32"): "tests/test_token_data.py",
    ("pipeline.md", "error: stage 0 (with_added_loss) adds 1 loss term(s) with add_loss"): "a builder of the tests' "
    "(tests/test_regularization.py)",
}

# Text blocks that are neither transcripts nor error lines, by a piece of their first line: why not compared.
TEXT = {
    ("checkpoints.md", "gpt (chain model=gpt), adamw: 20 steps"): "scripts/check_resume_layouts.py's output (minutes "
    "of training; tests/test_resume_layout.py checks each case at step 2 of 4)",
    ("checkpoints.md", "gpt2 (keras_hub GPT2CausalLM), adamw: 20 steps"): "scripts/check_resume_layouts.py's output "
    "(tests/test_resume_layout.py: GPT2CausalLM on 4 stages, CHAIN_TEST_ZOO=all)",
    ("pipeline.md", "note: pipeline.add_loss=per_microbatch"): "a cut MoE's note (tests/test_keras_hub.py, "
    "tests/test_regularization.py)",
    ("pipeline.md", "planning: measurements read from the run directory's"): "plan=auto's cache read by a resume "
    "(times and keys of one run: "
    "tests/test_auto_plan.py)",
    ("pipeline.md", "planning: measured in 1.0 s (the run directory's"): "plan=auto's cache of another model "
    "(times and keys of one run: "
    "tests/test_auto_plan.py)",
    ("cluster.md", "[...][chain][WARNING] - worker 1 (hostB:2222) lost at step 17"): "the log of a run that lost "
    "worker 1 (tests/test_cluster.py kills it and checks the line)",
    ("cluster.md", "replan: exit 0, ended at step 40"): "scripts/stress_lost.py's output (ports and seconds of "
    "one run)",
    ("architecture.md", "command line / chain.compose"): "a diagram of the layers",
    ("index.md", "chain/"): "the source tree",
    ("run-directory.md", "outputs/DATE/TIME/"): "the run directory's files",
    ("benchmarks-history.md", "measured: step 8"): "a measured timeline (times of a profiled run on two workers)",
    ("measuring.md", "schedule: gpipe, 2 stages x 8 microbatches"): "a measured timeline (times of a profiled run "
    "on two workers)",
    ("measuring.md", "planned and measured timelines"): "a measured timeline (times of a profiled run on two workers)",
    ("your-data.md", "note: checkpoint.accept_changed_files=true"): "a resume over the reader's changed files "
    "(tests/test_stream_identity.py)",
    ("measuring.md", "balance: stage 1 is the bottleneck"): "advice from measured times",
    ("language-models.md", "stage  device         physical  params   model"): "the log of a 2,000-step run (the test "
    "trains 3 steps)",
    ("language-models.md", "def __init__(self, other):"): "text generated by the 2,000-step run",
    ("language-models.md", "def function:"): "text generated by the 2,000-step run",
    ("pipeline.md", "stage 0  F0 F1 F2 F3 .  .  .  B0 W0"): "zb1's schedule drawn without devices; plan_only's form "
    "is compared in the transcripts",
}

# Commands of bash blocks run in full (their output is compared in a transcript, or a later block needs them).
RUN = {
    ("checkpoints.md", "python -m chain +stages=4 trainer.steps=100 hydra.run.dir=outputs/4-stage-run"),
    ("language-models.md", "python -m chain.generate outputs/gpt-stdlib"),
}

# Commands of bash blocks run short (a later block needs their run): the overrides appended (the last value
# of a key wins), so a run of minutes takes seconds here.
SHORT = {
    (
        "language-models.md",
        "python -m chain mode=e2e model=gpt model.width=128",
    ): "trainer.steps=3 optim.warmup_steps=1 trainer.log_every=1 data.val_fraction=0.001 trainer.progress=false "
    "model.width=32 model.depth=2 pipeline.microbatches=2",  # a smaller model: tracing was most of its time
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order, with the line their fence opens on."""
    text = page.read_text()
    return [
        Block(page.name, text[: m.start()].count("\n") + 1, m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
    ]


ASSIGNMENT = re.compile(r"([A-Z_][A-Z0-9_]*)=(\$\(.*\))")  # NAME=$(COMMAND): a shell variable


def commands(block: str) -> list[str]:
    """The shell commands of a bash block: continuation lines joined, comment lines dropped, `&&` split;
    a variable's assignment (`ASSIGNMENT`) kept as written."""
    joined = re.sub(r"\\\n\s*", "", block)
    out = []
    for line in joined.splitlines():
        if ASSIGNMENT.fullmatch(line.strip()):
            out.append(line.strip())
            continue
        words = shlex.split(line, comments=True)
        if not words:
            continue
        while "&&" in words:
            at = words.index("&&")
            out.append(shlex.join(words[:at]))
            words = words[at + 1 :]
        out.append(shlex.join(words))
    return out


def transcript(block: str) -> list[tuple[str, list[str]]]:
    """The (command, expected lines) pairs of a text block of `$ COMMAND` lines; [] for other text."""
    pairs: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs and not pairs[-1][1] and pairs[-1][0].endswith("\\"):  # a command continued on this line
            pairs[-1] = (pairs[-1][0][:-1].rstrip() + " " + line.strip(), [])
        elif pairs:
            pairs[-1][1].append(line)
    return pairs


def matches(expected: list[str], actual: list[str]) -> bool:
    """`actual` is `expected` line by line, `...` standing for any text (a line of only `...`: any lines)."""
    if not expected:
        return not actual
    if expected[0].strip() == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    pattern = ".*".join(re.escape(piece) for piece in expected[0].split("..."))
    return bool(actual) and re.fullmatch(pattern, actual[0]) is not None and matches(expected[1:], actual[1:])


def listed(table: dict | set, page: str, text: str) -> tuple[tuple[str, str], str | None] | None:
    """The first (key, reason) of `table` for `page` whose piece is in `text`, or None."""
    return next(
        ((key, table[key] if isinstance(table, dict) else None) for key in table if key[0] == page and key[1] in text),
        None,
    )


class Player:
    """Plays one page's blocks in `cwd`, collecting what disagrees with the page."""

    def __init__(self, cwd: Path):
        self.cwd, self.problems, self.used, self.done = cwd, [], set(), []
        self.variables: dict[str, str] = {}  # NAME -> value, set by a block's `NAME=$(COMMAND)`

    def shell(self, command: str) -> subprocess.CompletedProcess:
        """Run one command line: `python -m MODULE ...` through the test zygote, anything else in bash;
        the page's variables (`$NAME`) replaced by their values first."""
        for name, value in self.variables.items():
            command = command.replace(f"${name}", value)
        words = shlex.split(command)
        env = {}
        while words and re.match(r"[A-Z_]+=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[:2] == ["python", "-m"] and "&" not in words:
            return run_cli(self.cwd, *words[3:], module=words[2], env=env, timeout=600)
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env),
        )

    def bash(self, block: Block) -> None:
        for command in commands(block.text):
            where = f"{block.page}:{block.line}: {command}"
            skip = listed(SKIP, block.page, command)
            if skip:
                self.used.add(skip[0])
                continue
            assignment = ASSIGNMENT.fullmatch(command)
            if assignment:
                name = assignment.group(1)
                r = subprocess.run(
                    ["bash", "-c", f'{command} && printf %s "${name}"'],
                    cwd=self.cwd,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if r.returncode != 0 or not r.stdout:
                    self.problems.append(f"{where}: exit {r.returncode}, value {r.stdout!r}: {r.stderr.strip()[-600:]}")
                self.variables[name] = r.stdout
                continue
            run = listed(RUN, block.page, command)
            short = listed(SHORT, block.page, command)
            if run:
                self.used.add(run[0])
            elif short:
                self.used.add(short[0])
                command += " " + short[1]
            elif command.startswith("python -m chain ") and "plan_only=true" not in command:
                command += " plan_only=true"
            elif not command.startswith("python -m chain "):
                self.problems.append(f"{where}: not a chain command line and not listed in SKIP or RUN")
                continue
            start = time.monotonic()
            r = self.shell(command)
            self.done.append((command, time.monotonic() - start))
            if r.returncode != 0:
                self.problems.append(f"{where}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}")

    def text(self, block: Block) -> None:
        if not transcript(block.text):
            if not any(line.startswith("error:") for line in block.text.splitlines()):
                key = listed(TEXT, block.page, block.text.splitlines()[0] if block.text.strip() else "")
                if key:
                    self.used.add(key[0])
                else:
                    self.problems.append(
                        f"{block.page}:{block.line}: a text block that is no transcript "
                        f"(`$ COMMAND` lines), no error lines, and not listed in TEXT"
                    )
            for line in block.text.splitlines():
                shown = listed(SHOWN, block.page, line) if line.startswith("error:") else None
                if shown:
                    self.used.add(shown[0])
                elif line.startswith("error:"):
                    self.problems.append(
                        f"{block.page}:{block.line}: an error line shown without its command "
                        f"and not listed in SHOWN: {line[:100]}"
                    )
        for command, expected in transcript(block.text):
            where = f"{block.page}:{block.line}: $ {command}"
            skip = listed(SKIP, block.page, "$ " + command) or listed(SKIP, block.page, command)
            if skip:
                self.used.add(skip[0])
                continue
            start = time.monotonic()
            r = self.shell(command)
            self.done.append((command, time.monotonic() - start))
            actual = (r.stdout + r.stderr).rstrip("\n").splitlines()
            while expected and not expected[-1].strip():
                expected = expected[:-1]
            if not matches(expected, actual):
                self.problems.append(
                    f"{where}: the page shows\n  "
                    + "\n  ".join(expected)
                    + f"\nbut it printed (exit {r.returncode})\n  "
                    + "\n  ".join(actual[-40:])
                )

    def python(self, block: Block) -> None:
        where = f"{block.page}:{block.line}: python block"
        first = block.text.strip().splitlines()[0] if block.text.strip() else ""
        skip = listed(SKIP, block.page, block.text)
        if skip:
            self.used.add(skip[0])
            return
        # Run as `python -m` of a file holding it, forked from the test zygote (TensorFlow imported once).
        module = f"doc_block_line_{block.line}"
        (self.cwd / f"{module}.py").write_text(block.text)
        start = time.monotonic()
        r = run_cli(self.cwd, module=module, timeout=600)
        self.done.append((first, time.monotonic() - start))
        if r.returncode != 0:
            self.problems.append(f"{where}: exit {r.returncode}: {r.stderr.strip()[-1500:]}")


def examples_blocks(page: Path) -> set[int]:
    """Lines of the `<!-- examples -->` blocks (tests/test_examples.py runs them)."""
    text = page.read_text()
    return {text[: m.start()].count("\n") + 2 for m in re.finditer(r"<!-- examples -->\n```bash\n", text)}


def play(page: Path, cwd: Path) -> Player:
    os.symlink(ROOT / "examples", cwd / "examples")
    if page.name in SETUP:
        SETUP[page.name](cwd)
    player = Player(cwd)
    handled = examples_blocks(page)
    for block in blocks(page):
        if block.line in handled:
            continue
        if block.lang == "bash":
            player.bash(block)
        elif block.lang == "python":
            player.python(block)
        elif block.lang == "text":
            player.text(block)
    return player


# Pages another test plays whole: python-api.md's blocks are one script, run top to bottom in one process
# (tests/test_notebook.py), since its devices are set up once for the page.
ELSEWHERE = {"python-api.md": "tests/test_notebook.py"}
PLAYED = [p for p in PAGES if p.name not in ELSEWHERE and any(b.lang in ("bash", "python", "text") for b in blocks(p))]


@pytest.mark.parametrize("page", PLAYED, ids=[p.name for p in PLAYED])
def test_a_pages_examples_run_as_the_page_shows(page, tmp_path):
    player = play(page, tmp_path)
    for command, seconds in player.done:  # shown with -s, or on a failure: where the time goes
        print(f"{seconds:6.1f} s  {command[:140]}")
    stale = [key for key in [*SKIP, *RUN, *SHORT, *SHOWN, *TEXT] if key[0] == page.name and key not in player.used]
    assert not stale, f"listed in SKIP or RUN but on no block of {page.name} any more: {stale}"
    assert not player.problems, "\n\n".join(player.problems)


def test_every_page_with_examples_is_played_and_every_listed_page_exists():
    names = {p.name for p in PAGES}
    assert {key[0] for key in [*SKIP, *RUN, *SHORT, *SHOWN, *TEXT]} <= names
    assert {"README.md", "your-data.md", "pipeline.md"} <= {p.name for p in PLAYED}
    played = {p.name for p in PLAYED} | set(ELSEWHERE)
    with_blocks = {p.name for p in PAGES if any(b.lang in ("bash", "python", "text") for b in blocks(p))}
    assert with_blocks == played


def test_the_matcher_takes_elisions_and_nothing_else():
    assert matches(["a", "...", "[...] b ...", "c"], ["a", "x", "y", "[2026] b 1 2", "c"])
    assert matches(["a", "...", "c"], ["a", "c"])
    assert not matches(["a", "c"], ["a", "x", "c"])
    assert not matches(["step 10  loss 2.2558"], ["step 10  loss 2.2379"])
    assert not matches(["a"], ["a", "b"])
    assert commands("x \\\n    y  # comment\n# only a comment\na && b\n") == ["x y", "a", "b"]
    assert commands("DIR=$(python -c 'print(1)')\n") == ["DIR=$(python -c 'print(1)')"]
    assert transcript("$ x \\\n    y \\\n  z\nout\n$ w\n") == [("x y z", ["out"]), ("w", [])]


def test_the_lost_worker_line_cluster_md_shows_is_the_one_the_client_prints():
    """cluster.md shows the line a client prints when a worker is killed mid-run (tests/test_cluster.py
    kills one); here the same line, for a port where nothing listens, against the page's."""
    import socket

    from chain.planning.cluster import find_lost

    (shown,) = [
        line for b in blocks(ROOT / "docs" / "cluster.md") for line in b.text.splitlines() if " is lost: " in line
    ]
    m = re.fullmatch(r"error: cluster worker (\d+) \((\S+)\) is lost: (.*?); (.*)", shown)
    assert m, shown
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    lost = find_lost([f"localhost:{port}"], m.group(4))
    assert lost is not None
    assert f"error: {lost}" == shown.replace(f"worker {m.group(1)} ({m.group(2)})", f"worker 0 (localhost:{port})")


# docs/cluster.md's scheduler examples, simulated on loopback with the environment each scheduler sets (a yaml
# block is not played above: the TFJob manifest is read here). Both run the same chain command, so one local
# run is the reference of both.
def cluster_md_examples() -> tuple[list[str], list[str], list[str]]:
    """(the TFJob chief's command, the worker's, the sbatch script's srun command without srun's options)."""
    import yaml

    page = blocks(ROOT / "docs" / "cluster.md")
    (manifest,) = [yaml.safe_load(b.text) for b in page if b.lang == "yaml"]
    specs = manifest["spec"]["tfReplicaSpecs"]
    chief, worker = (specs[k]["template"]["spec"]["containers"][0]["command"] for k in ("Chief", "Worker"))
    assert specs["Chief"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    (srun,) = [shlex.split(c) for b in page if b.lang == "bash" for c in commands(b.text) if c.startswith("srun ")]
    srun = srun[1:]
    while srun[0].startswith("-"):
        srun.pop(0)
    return chief, worker, srun


def chain_args(command: list[str]) -> list[str]:
    """A `python -m chain ...` command's overrides, without the run directory and the launcher (the tests' own)."""
    assert command[:3] == ["python", "-m", "chain"], command
    return [a for a in command[3:] if not a.startswith(("hydra.run.dir=", "cluster.launcher="))]


@pytest.fixture(scope="module")
def cluster_md_local(tmp_path_factory):
    """cluster.md's chain command run on this machine's logical devices: what both schedulers must train."""
    from test_schedulers import TINY, final

    root = tmp_path_factory.mktemp("local")
    r = run_cli(root, *chain_args(cluster_md_examples()[0]), *TINY, f"hydra.run.dir={root / 'run'}")
    assert r.returncode == 0, r.stderr
    return final(root / "run")


def test_cluster_md_tfjob_manifest_runs_as_a_chief_and_two_workers(tmp_path, cluster_md_local):
    from compare import assert_values_alike
    from chain.worker import free_addresses
    from test_schedulers import TINY, final, finish, start

    chief_command, worker_command, _ = cluster_md_examples()
    chief, *workers = free_addresses(3)

    def tf_config(kind: str, index: int) -> dict:  # as TFJob writes it into each pod
        spec = {"chief": [chief], "worker": workers}
        return {"TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": kind, "index": index}})}

    assert worker_command == ["python", "-m", "chain.worker"]
    # the operator starts pods in any order: the chief first here (it waits for its workers)
    procs = [
        start(
            tmp_path,
            ["chain", *chain_args(chief_command), *TINY, f"hydra.run.dir={tmp_path / 'run'}"],
            tf_config("chief", 0),
        ),
        *(start(tmp_path, worker_command[2:], tf_config("worker", i)) for i in range(2)),
    ]
    outs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert f"worker 1 {workers[1]} CPU:0" in outs[0][0]
    assert [o.splitlines()[-1] for o, _ in outs[1:]] == ["worker 0 stopped", "worker 1 stopped"], outs
    ran = final(tmp_path / "run")
    for k in range(2):
        assert_values_alike(ran[k], cluster_md_local[k], rtol=1e-6)


def test_cluster_md_sbatch_script_runs_as_three_slurm_tasks(tmp_path, cluster_md_local):
    from compare import assert_values_alike
    from test_schedulers import TINY, consecutive_ports, final, finish, start

    _, _, srun = cluster_md_examples()
    assert srun[:4] == ["python", "-m", "chain", "cluster.launcher=slurm"], srun
    base = consecutive_ports(3)
    args = ["chain", *srun[3:], f"cluster.port_base={base}", *TINY, f"hydra.run.dir={tmp_path / 'run'}"]
    env = {"SLURM_NTASKS": "3", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "3"}
    procs = [start(tmp_path, args, dict(env, SLURM_PROCID=str(i))) for i in range(3)]
    outs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert f"worker 1 localhost:{base + 2} CPU:0" in outs[0][0]
    assert [o.splitlines()[0] for o, _ in outs[1:]] == [
        f"worker {i} serving localhost:{base + 1 + i} (grpc://localhost:{base + 1 + i})" for i in range(2)
    ]
    assert chain_args(srun) == chain_args(cluster_md_examples()[0])  # the reference's command
    ran = final(tmp_path / "run")
    for k in range(2):
        assert_values_alike(ran[k], cluster_md_local[k], rtol=1e-6)
