"""What is restored is what this run saved: checkpoint identity, damage, fallback, a rebuilt
manifest, and failed saves. In-process, on the test session's logical devices."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import chain
from chain.errors import CheckpointError, StorageError
from compare import weights

# Two identical stages (a homogeneous chain: swapping their directories is a plausible mistake).
SMALL = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "model.dropout=0.25",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
STEPS, EVERY = 6, 2


def fit(run_dir, *overrides):
    run = chain.build(
        chain.compose([*SMALL, f"trainer.steps={STEPS}", f"checkpoint.every={EVERY}", *overrides]), run_dir=str(run_dir)
    )
    run.fit()
    return run


def fresh(*overrides):
    return chain.build(chain.compose([*SMALL, f"trainer.steps={STEPS}", *overrides]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run with complete checkpoints at steps 2, 4, 6, and its final weights."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run = fit(run_dir)
    return str(run_dir), weights(run)


@pytest.fixture
def copy(trained, tmp_path):
    """A fresh copy of the trained run directory, to damage."""
    target = str(tmp_path / "copy")
    shutil.copytree(trained[0], target)
    return target


def refused(run_dir, match, **kw):
    run = fresh()
    before = weights(run)
    with pytest.raises(CheckpointError) as e:
        run.restore(run_dir, **kw)
    assert "\n" not in str(e.value)
    assert match in str(e.value), str(e.value)
    for a, b in zip(before, weights(run)):  # nothing was restored, not even partially
        np.testing.assert_array_equal(a, b)
    return str(e.value)


def test_an_intact_checkpoint_restores_and_records_its_identity(trained):
    run_dir, final = trained
    m = json.load(open(os.path.join(run_dir, "checkpoint.json")))
    assert m["format"] == 2 and len(m["run"]) == 32 and m["complete"] == [2, 4, 6]
    assert set(m["digests"]) == {"2", "4", "6"} and set(m["digests"]["6"]) == {"stage_00", "stage_01", "data"}
    run = fresh()
    assert run.restore(run_dir)["step"] == STEPS
    for a, b in zip(weights(run), final):
        np.testing.assert_array_equal(a, b)


def test_swapped_stage_directories_are_refused(copy):
    os.rename(os.path.join(copy, "stage_00"), os.path.join(copy, "tmp"))
    os.rename(os.path.join(copy, "stage_01"), os.path.join(copy, "stage_00"))
    os.rename(os.path.join(copy, "tmp"), os.path.join(copy, "stage_01"))
    refused(copy, "stage_00/ckpt-6 holds stage_01 of this run, not stage_00")


def test_a_stage_directory_from_another_run_is_refused(copy, tmp_path):
    other = tmp_path / "other"
    fit(other, "seed=7")
    shutil.rmtree(os.path.join(copy, "stage_01"))
    shutil.copytree(other / "stage_01", os.path.join(copy, "stage_01"))
    message = refused(copy, "stage_01/ckpt-6 was written by another run")
    assert "no older complete checkpoint" in message  # every step of stage_01 is the other run's


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "missing"])
def test_a_damaged_newest_checkpoint_names_the_file_and_offers_the_older_one(copy, damage):
    data = os.path.join(copy, "stage_01", "ckpt-6.data-00000-of-00001")
    size = os.path.getsize(data)
    if damage == "truncated":
        os.truncate(data, size // 2)
    elif damage == "zeroed":
        with open(data, "r+b") as f:
            f.write(bytes(size))
    else:
        os.remove(data)
    what = "is missing" if damage == "missing" else "is damaged: its contents differ from what was saved at step 6"
    message = refused(copy, f"stage_01/ckpt-6.data-00000-of-00001 {what}")
    assert message.endswith("step 4 verifies: resume from it with checkpoint.fallback=true")


def test_fallback_resumes_from_the_newest_older_step_and_ends_bit_exact(copy, trained, tmp_path):
    """Falling back to step 4 restores step 4 exactly (weights, slots, the data stream), so
    training on to step 6 reproduces the uninterrupted run bit for bit."""
    with open(os.path.join(copy, "stage_00", "ckpt-6.index"), "r+b") as f:
        f.write(b"\0" * 16)
    run = chain.build(
        chain.compose(
            [*SMALL, f"trainer.steps={STEPS}", f"checkpoint.every={EVERY}", "resume=true", "checkpoint.fallback=true"]
        ),
        run_dir=copy,
    )
    summary = run.fit()
    assert summary["resumed_from"] == 4
    for a, b in zip(weights(run), trained[1]):
        np.testing.assert_array_equal(a, b)
    m = json.load(open(os.path.join(copy, "checkpoint.json")))
    assert m["step"] == 6 and m["complete"] == [2, 4, 6]


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "not a manifest"])
def test_a_damaged_manifest_is_rebuilt_from_the_stage_directories(copy, trained, damage):
    path = os.path.join(copy, "checkpoint.json")
    text = open(path).read()
    content = {
        "truncated": text[: len(text) // 2],
        "empty": "",
        "garbage": "\x00\x01garbage",
        "not a manifest": "[1, 2, 3]",
    }[damage]
    with open(path, "w") as f:
        f.write(content)
    run = fresh()
    m = run.restore(copy)
    assert m["step"] == 6 and m["complete"] == [2, 4, 6]
    assert m["run"] == json.loads(text)["run"]
    for a, b in zip(weights(run), trained[1]):
        np.testing.assert_array_equal(a, b)
    assert json.load(open(path))["digests"] == json.loads(text)["digests"]  # rebuilt on disk, same files


def test_a_damaged_manifest_with_disagreeing_stage_directories_is_refused(copy):
    open(os.path.join(copy, "checkpoint.json"), "w").close()
    for step in (2, 4, 6):  # data/ keeps no step that the stages also hold whole
        for f in os.listdir(os.path.join(copy, "data")):
            if f.startswith(f"ckpt-{step}."):
                os.remove(os.path.join(copy, "data", f))
    message = refused(copy, "checkpoint.json is empty, and the stage directories do not agree on a complete step")
    assert "data: none" in message


def test_a_failed_save_keeps_the_last_complete_checkpoint_and_leaves_nothing_of_it(tmp_path, monkeypatch, trained):
    """A full disk while saving step 4 (after both stages were written): one line, the
    manifest still names step 2, no file of step 4 survives; a resume from step 2 ends
    where the uninterrupted run ended."""
    run_dir = str(tmp_path / "full")
    monkeypatch.setenv("CHAIN_TEST_FAIL_SAVE", "4")
    with pytest.raises(StorageError) as e:
        fit(run_dir)
    assert str(e.value).startswith(f"cannot save the checkpoint of step 4 in {run_dir}: No space left on device")
    assert str(e.value).endswith("the last complete checkpoint (step 2) is intact") and "\n" not in str(e.value)
    assert json.load(open(os.path.join(run_dir, "checkpoint.json")))["step"] == 2
    leftovers = [
        f
        for d in ("stage_00", "stage_01", "data")
        for f in os.listdir(os.path.join(run_dir, d))
        if f.startswith("ckpt-4")
    ]
    assert leftovers == []
    monkeypatch.delenv("CHAIN_TEST_FAIL_SAVE")
    run = fit(run_dir, "resume=true")
    for a, b in zip(weights(run), trained[1]):
        np.testing.assert_array_equal(a, b)
