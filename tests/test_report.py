"""The run report (`python -m chain.report`, `report=true`): one self-contained page with a curve
image per stage, the placement table and the timelines; curves of a killed and resumed run
are continuous; several runs compare on one page; TensorBoard event files merge so that a
later file wins from its first step on."""

from __future__ import annotations

import base64
import glob
import os
import re

import pytest

import chain
from chain.report import scalars
from conftest import read_summary, run_cli

SMALL = ["model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]


def images(page: str) -> dict[str, bytes]:
    """alt text -> the PNG bytes of every embedded image."""
    return {
        alt: base64.b64decode(data)
        for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', page)
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-stage e2e run, profiled, with report=true."""
    run_dir = str(tmp_path_factory.mktemp("finished"))
    cfg = chain.compose(
        [
            "+stages=3",
            "mode=e2e",
            "pipeline.schedule=gpipe",
            "pipeline.microbatches=2",
            *SMALL,
            "trainer.steps=4",
            "trainer.log_every=1",
            "trainer.profile=[2,3]",
            "report=true",
        ]
    )
    chain.build(cfg, run_dir=run_dir).fit()
    return run_dir


def test_report_true_writes_a_self_contained_page_with_curves_placement_and_timelines(finished):
    with open(os.path.join(finished, "report.html")) as f:
        page = f.read()
    found = images(page)
    # mode=e2e: the chain's loss drawn once, not again in a panel per stage (the stages log none of their own)
    assert found["chain curves"].startswith(b"\x89PNG") and not [a for a in found if a.startswith("stage ")]
    assert "3 stages (0, 1, 2) logged no scalars of their own (mode=e2e" in page
    # Every scalar tb/chain holds is drawn, the one evaluation at the end (no trainer.eval_every) included.
    held = scalars.read_run(finished)["chain"]
    assert {"loss", "val_loss", "val_accuracy"} <= set(held) and len(held["val_loss"]) == 1
    drawn = re.search(r'<p class="note" id="scalars-chain">scalars: (.*?)</p>', page).group(1)
    assert drawn == ", ".join(f"{t} ({len(p)} point{'s' * (len(p) != 1)})" for t, p in sorted(held.items()))
    assert found["planned timeline"].startswith(b"\x89PNG") and found["measured timeline"].startswith(b"\x89PNG")
    assert found["peak memory"].startswith(b"\x89PNG")
    assignment = re.search(r'<table id="placement">(.*?)</table>', page, re.S).group(1)
    for s in read_summary(finished)["stages"]:
        assert f"<td>{s['device']}</td>" in assignment and f"<td>{s['model']}</td>" in assignment
    assert 'id="measured"' in page and "measured bubble fraction" in page
    # nothing to fetch: no link, script or image from elsewhere
    assert not re.search(r'(src|href)="(?!data:)', page) and "<script" not in page


def test_the_report_command_compares_runs(finished, tmp_path):
    other = str(tmp_path / "other")
    cfg = chain.compose(
        ["+stages=3", "mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2", *SMALL, "trainer.steps=3"]
    )
    chain.build(cfg, run_dir=other).fit()
    out = str(tmp_path / "both.html")
    r = run_cli(tmp_path, finished, other, "-o", out, module="chain.report")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"report: {out}"
    with open(out) as f:
        page = f.read()
    metrics = re.search(r'<table id="metrics">(.*?)</table>', page, re.S).group(1)
    assert "gpipe" in metrics and "1f1b" in metrics
    assert images(page)["chain curves"].startswith(b"\x89PNG")


def test_a_directory_without_a_run_is_one_line(tmp_path):
    r = run_cli(tmp_path, str(tmp_path), module="chain.report")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "is not a run directory" in r.stderr


def test_report_of_a_killed_and_resumed_run_shows_continuous_curves(tmp_path):
    run_dir = str(tmp_path / "run")
    args = [
        "+stages=2",
        *SMALL,
        "trainer.steps=12",
        "trainer.log_every=1",
        "checkpoint.every=4",
        f"hydra.run.dir={run_dir}",
    ]
    r = run_cli(tmp_path, *args, env={"CHAIN_TEST_KILL_AT_STEP": "6"})
    assert r.returncode == -9, r.stderr
    r = run_cli(tmp_path, *args, "resume=true")
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, run_dir, module="chain.report")
    assert r.returncode == 0, r.stderr

    for writer in ("stage_00", "stage_01", "chain"):
        files = sorted(glob.glob(os.path.join(run_dir, "tb", writer, "events.out.tfevents.*")))
        assert len(files) == 2, writer  # the killed run's and the resumed run's
        merged = scalars.read_writer(os.path.join(run_dir, "tb", writer))
        assert [s for s, _ in merged["loss"]] == list(range(1, 13)), writer  # no gap, no duplicate
        (_, older), (_, newer) = sorted((scalars.read_file(f) for f in files), key=lambda f: f[0])
        assert max(older["loss"]) >= 4 and min(newer["loss"]) == 5  # flushed at the checkpoint; resumed after it
        assert dict(merged["loss"]) == {**older["loss"], **newer["loss"]}
    with open(os.path.join(run_dir, "report.html")) as f:
        page = f.read()
    assert {"stage 0 curves", "stage 1 curves", "chain curves"} <= set(images(page))


def test_a_later_event_file_replaces_the_earlier_points_from_its_first_step_on():
    old = {"loss": {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}, "acc": {2: 0.5}}
    new = {"loss": {3: 30.0, 5: 50.0}}
    assert scalars.merge([old, new]) == {"loss": [(1, 1.0), (2, 2.0), (3, 30.0), (5, 50.0)], "acc": [(2, 0.5)]}
