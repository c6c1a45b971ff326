"""Kill a training run with SIGKILL at random moments, resume it each time, and check that it ends
exactly where an uninterrupted run ends.

    python scripts/stress_kill.py                      # 25 kills per mode, local and e2e (1F1B)
    python scripts/stress_kill.py --kills 3 --modes local
    python scripts/stress_kill.py --stream --kills 20  # on TFRecord shards streamed (data.stream=true)
    python scripts/stress_kill.py --stream npz --kills 8  # the same records in one .npz (or csv: CSV files)

Not a test (tests/test_stress.py runs it briefly). For each mode: one uninterrupted run,
then one victim run directory that is started, killed at a uniformly random moment between
its first step and its end (timed from the uninterrupted run), and resumed (`resume=true`), again and again. Saves are made
slow (`CHAIN_TEST_SAVE_PAUSE`, a pause after each part of a save) and frequent, so many
kills land in the middle of a save. Every resume verifies the files of the checkpoint it
restores against the digests in checkpoint.json and refuses a torn or foreign one; at the
end the script checks that the last resume left no temporary folder or unkept step behind,
and that every variable of the final checkpoint equals the uninterrupted run's, bit for bit.

Counted and printed: kills, kills that landed mid-save, torn checkpoints a resume used
(a resume verifies every file against the digests of checkpoint.json: one that refused a
checkpoint, or a final mismatch, counts), leftover temporary folders after a resume, and
whether the final weights are bit-exact. Exit status 1 if any check failed.

With `--stream` both runs train on TFRecord shards generated into the work directory (5 files
of 64 records of 64 floats, 10 classes; one file held out for validation), streamed
(`data.stream=true`, a shuffle buffer of 48): 12 steps of 32 examples cross an epoch of the 256
training records, so the resumed stream must also restore the files' order and the shuffle.
`--stream npz` and `--stream csv` write the same records into one `.npz` (the last 64 rows held
out) or five CSV files (the last held out) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_input's writers

MODES = {
    "local": ["mode=local"],
    "e2e": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
}
BASE = [
    "+stages=2",
    "model.width=16",
    "model.dropout=0.2",
    "data.batch_size=32",
    "trainer.progress=false",
    "checkpoint.export=false",
    "trainer.log_every=1",
    "checkpoint.every=1",
    "checkpoint.keep=2",
]


STREAM = ["data.y=y", "data.classes={label: 10}", "data.stream=true", "data.shuffle_buffer=48", "data.val_fraction=0.2"]
SOURCES = {
    "tfrecord": ["data=tfrecord", "data.features={x: 'float32[64]', y: int64}"],
    "npz": ["data=npz", "data.x=x"],
    "csv": ["data=csv"],
}


def write_data(root: str, source: str) -> list[str]:
    """5 files of 64 records {x: 64 uniform floats, y: int64 label of x[0]} as `source` reads them
    (TFRecord or CSV files; one .npz of the same records in the same order); the settings that read them."""
    from chain.cli import import_tensorflow_quietly

    import_tensorflow_quietly()
    import numpy as np
    from bench_input import write_csv, write_tfrecord

    os.makedirs(root, exist_ok=True)
    x = np.random.default_rng(0).random((5 * 64, 64), dtype=np.float32)
    y = (x[:, 0] * 10).astype(np.int64)
    if source == "npz":  # val_fraction 0.2: the last 64 rows held out
        np.savez(os.path.join(root, "data.npz"), x=x, y=y)
        return [*SOURCES[source], *STREAM, f"data.path={root}/data.npz"]
    tfrecord = source == "tfrecord"
    write, ext = (write_tfrecord, "tfrecord") if tfrecord else (write_csv, "csv")
    for s in range(5):  # val_fraction 0.2 holds out the last of the five files
        write(os.path.join(root, f"part-{s:03d}.{ext}"), x[s * 64 : (s + 1) * 64], y[s * 64 : (s + 1) * 64])
    return [*SOURCES[source], *STREAM, f"data.path={root}/*.{ext}"]


def run(cwd: str, args: list[str], env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "chain", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def final_values(run_dir: str) -> dict:
    """Every variable of every part of the newest complete checkpoint (identity, save counter and the
    data part's record of settings and losses aside: it describes the state, it is not state)."""
    from chain.cli import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    m = json.load(open(os.path.join(run_dir, "checkpoint.json")))
    out = {}
    for part, where in m["checkpoints"].items():
        reader = tf.train.load_checkpoint(os.path.join(run_dir, where))
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if key.startswith(("identity/", "save_counter/", "record/", "_CHECKPOINTABLE")) or dtype == tf.variant:
                continue
            out[f"{part}/{key}"] = reader.get_tensor(key)
    return out


def leftovers(run_dir: str) -> list[str]:
    """`ckpt-N_temp` folders, and checkpoint files of steps the manifest does not keep."""
    m = json.load(open(os.path.join(run_dir, "checkpoint.json")))
    bad = []
    for part in m["checkpoints"]:
        for f in os.listdir(os.path.join(run_dir, part)):
            step = re.match(r"^ckpt-(\d+)", f)
            if f.endswith("_temp") or (step and int(step.group(1)) not in m["complete"]):
                bad.append(f"{part}/{f}")
    return bad


class Victim:
    """One `python -m chain` process whose stderr is read as it comes (its test-hook lines)."""

    def __init__(self, workdir: str, args: list[str], pause: float):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHAIN_TEST_SAVE_PAUSE=str(pause), CHAIN_TEST_ANNOUNCE="1")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "chain", *args],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.first_step = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line)
            if "test-hook: step" in line:
                self.first_step.set()
        self.first_step.set()  # ended

    def finish(self) -> tuple[int, str]:
        code = self.p.wait()
        self.reader.join()
        return code, "".join(self.lines)


def stress(
    mode: str, kills: int, steps: int, workdir: str, rng: random.Random, pause: float, data: list[str] = ()
) -> dict:
    args = [*MODES[mode], *BASE, *data, f"trainer.steps={steps}"]
    straight = os.path.join(workdir, f"{mode}-straight")
    v = Victim(workdir, [*args, f"hydra.run.dir={straight}"], pause)
    v.first_step.wait()
    started = time.perf_counter()
    code, err = v.finish()
    if code != 0:
        raise SystemExit(f"the uninterrupted {mode} run failed: {err.strip()[-500:]}")
    training = time.perf_counter() - started  # from the first step to the end
    victim = os.path.join(workdir, f"{mode}-victim")
    result = {"mode": mode, "kills": 0, "mid_save": 0, "refused": 0, "leftovers": 0, "resumes": 0}

    def resume() -> list[str]:
        return ["resume=true"] if os.path.exists(os.path.join(victim, "checkpoint.json")) else []

    while result["kills"] < kills:
        extra = resume()
        v = Victim(workdir, [*args, f"hydra.run.dir={victim}", *extra], pause)
        v.first_step.wait(timeout=600)
        time.sleep(rng.uniform(0.0, 1.0) * training)  # a uniformly random moment of its training
        if v.p.poll() is not None:  # it finished (or failed) before the kill
            code, err = v.finish()
            if code != 0:
                result["refused"] += 1
                print(f"  {mode}: a resume failed: {err.strip()[-300:]}", file=sys.stderr)
                break
            shutil.rmtree(victim)  # finished: start over, to kill it again
            continue
        v.p.kill()
        _, err = v.finish()
        result["kills"] += 1
        hooks = re.findall(r"test-hook: saved (\S+) of step (\d+)|test-hook: step (\d+) done", err)
        if hooks and hooks[-1][0] and hooks[-1][0] != "data":  # killed between two parts of one save
            result["mid_save"] += 1
        if extra:
            result["resumes"] += 1
    r = run(workdir, [*args, f"hydra.run.dir={victim}", *resume()])
    if r.returncode != 0:
        result["refused"] += 1
        print(f"  {mode}: the final resume failed: {r.stderr.strip()[-300:]}", file=sys.stderr)
        return {**result, "bit_exact": False}
    result["leftovers"] = len(leftovers(victim))
    a, b = final_values(straight), final_values(victim)
    result["bit_exact"] = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and (a[k] == b[k]).all() for k in a)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=25, help="SIGKILLs per mode")
    ap.add_argument("--modes", default="local,e2e")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds of pause after each part of a save")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument(
        "--stream",
        nargs="?",
        const="tfrecord",
        choices=list(SOURCES),
        help="train on generated files, data.stream=true: TFRecord shards (the default), the same "
        "records in one .npz (npz) or in CSV files (csv)",
    )
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    workdir = a.workdir or tempfile.mkdtemp(prefix="stress_kill_")
    data = write_data(os.path.join(workdir, "shards"), a.stream) if a.stream else []
    ok = True
    for mode in a.modes.split(","):
        r = stress(mode, a.kills, a.steps, workdir, rng, a.pause, data)
        line = (
            f"{mode}: {r['kills']} kills ({r['mid_save']} in the middle of a save, {r['kills'] - r['mid_save']} "
            f"between saves), {r['resumes']} of them killed resumes, "
            f"torn checkpoints used: {r['refused']}, leftovers after resume: {r['leftovers']}, "
            f"final weights bit-exact: {r['bit_exact']}"
        )
        print(line, flush=True)
        ok &= r["refused"] == 0 and r["leftovers"] == 0 and r["bit_exact"] and r["kills"] == a.kills
    if a.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
