"""Resuming with changed settings, and what a resume trusts: the settings a run was trained
with are recorded inside its checkpoints (verified like every other checkpoint file), so a
torn or edited `checkpoint.json` cannot let a change through; a learning rate (or beta,
momentum) given on resume applies from the resumed step, with a `note:`; whatever else changes
the math or the data stream is refused in one line naming the key; cadence keys may change.
In-process, on the test session's logical devices (one CLI case for the new-run refusal)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

import chain
from chain.errors import ChainError, CheckpointError
from compare import weights
from conftest import EXTENDED, run_cli

SMALL = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "model.dropout=0.25",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
E2E = ["mode=e2e", "pipeline.schedule=gpipe", "pipeline.microbatches=2"]
STEPS, EVERY = 6, 3


def compose(*overrides):
    return chain.compose([*SMALL, f"trainer.steps={STEPS}", *overrides])


def fit(run_dir, *overrides, callback=None):
    run = chain.build(compose(f"checkpoint.every={EVERY}", *overrides), run_dir=str(run_dir))
    run.fit(callback)
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished mode=local run with complete checkpoints at steps 3 and 6, and its final weights."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    return str(run_dir), weights(fit(run_dir))


@pytest.fixture(scope="module")
def trained_e2e(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained_e2e") / "run"
    fit(run_dir, *E2E)
    return str(run_dir)


@pytest.fixture
def copy(trained, tmp_path):
    target = str(tmp_path / "copy")
    shutil.copytree(trained[0], target)
    return target


def refused(run_dir, *overrides) -> str:
    """Restoring `run_dir` into a chain built with `overrides` is one ChainError line, and
    nothing was restored, not even partially."""
    run = chain.build(compose(*overrides))
    before = weights(run)
    with pytest.raises(ChainError) as e:
        run.restore(run_dir)
    assert "\n" not in str(e.value)
    for a, b in zip(before, weights(run)):
        np.testing.assert_array_equal(a, b)
    return str(e.value)


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("note:")]


# --- settings that may change: applied from the resumed step, with a note ----------------------------


@pytest.mark.parametrize(
    "optim, old, new",
    [
        # the suite's time: SGD's learning rate (a Keras optimizer's, set the same way) changes every time
        pytest.param(["optim=adam"], 0.001, 0.0005, marks=EXTENDED),
        (["optim=sgd", "optim.momentum=0.9"], 0.05, 0.01),
    ],
)
def test_a_changed_learning_rate_applies_from_the_resumed_step(tmp_path, caplog, optim, old, new):
    """Resumed at step 3 with another optim.lr, the run ends bit for bit where an uninterrupted
    run ends whose optimizers' learning rate is set (Keras: `optimizer.learning_rate.assign`)
    after step 3; the change is one note."""
    run_dir = tmp_path / "run"
    fit(run_dir, *optim, "trainer.steps=3")
    caplog.set_level(logging.INFO, logger="chain")
    resumed = fit(run_dir, *optim, f"optim.lr={new}", "resume=true")
    assert notes(caplog) == [f"note: optim.lr {old} -> {new} from step 3"]

    def change(step, _):
        if step == 3:
            for s in oracle.stages:
                s.optimizer.learning_rate.assign(new)

    oracle = chain.build(compose(*optim, "trainer.steps_per_call=1"))
    oracle.fit(change)
    for a, b in zip(weights(resumed), weights(oracle), strict=True):
        np.testing.assert_array_equal(a, b)
    unchanged = chain.build(compose(*optim))  # the change mattered: without it the weights differ
    unchanged.fit()
    assert any(not np.array_equal(a, b) for a, b in zip(weights(resumed), weights(unchanged)))
    assert json.load(open(run_dir / "checkpoint.json"))["step"] == STEPS


def test_a_learning_rate_of_one_stage_is_named_with_its_stage(tmp_path, caplog):
    run_dir = tmp_path / "run"
    fit(run_dir, "trainer.steps=3")
    caplog.set_level(logging.INFO, logger="chain")
    resumed = fit(run_dir, "+stages=[{},{optim: {lr: 0.01}}]", "resume=true")
    assert notes(caplog) == ["note: stages[1].optim.lr 0.001 -> 0.01 from step 3"]
    assert [float(s.optimizer.learning_rate.numpy()) for s in resumed.stages] == [np.float32(0.001), np.float32(0.01)]


@pytest.mark.parametrize(
    "optim, change, note",
    [
        (["optim=adam"], "optim.beta_1=0.8", "note: optim.beta_1 0.9 -> 0.8 from step 3"),
        (["optim=sgd", "optim.momentum=0.9"], "optim.momentum=0.5", "note: optim.momentum 0.9 -> 0.5 from step 3"),
    ],
)
def test_a_changed_beta_or_momentum_applies_with_a_note(tmp_path, caplog, optim, change, note):
    run_dir = tmp_path / "run"
    fit(run_dir, *optim, "trainer.steps=3")
    caplog.set_level(logging.INFO, logger="chain")
    fit(run_dir, *optim, change, "resume=true")
    assert notes(caplog) == [note]


def test_cadence_and_length_may_change_on_resume_without_changing_the_result(copy, trained, caplog):
    """Log, evaluation and checkpoint cadence, steps per call, on_nan and the run's length are not
    the math: resumed from step 3 with all of them changed, the run ends bit-exact, without a note."""
    m = json.load(open(os.path.join(copy, "checkpoint.json")))
    m = {
        **m,
        "step": 3,
        "complete": [3],
        "digests": {"3": m["digests"]["3"]},
        "checkpoints": {k: f"{k}/ckpt-3" for k in m["checkpoints"]},
        "validation": {"3": m["validation"]["3"]},
    }
    open(os.path.join(copy, "checkpoint.json"), "w").write(json.dumps(m))  # as if killed after step 3's save
    caplog.set_level(logging.INFO, logger="chain")
    run = fit(
        copy,
        "resume=true",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "trainer.steps_per_call=1",
        "checkpoint.every=1",
        "checkpoint.keep=5",
        "trainer.on_nan=skip",
        "checkpoint.best=true",
    )
    assert notes(caplog) == []
    for a, b in zip(weights(run), trained[1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.load(open(os.path.join(copy, "checkpoint.json")))["complete"] == [3, 4, 5, 6]


# --- settings that may not change: one line naming the key, nothing restored -------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.activation=tanh", "model.activation='relu', the config has model.activation='tanh'"),
        ("model.dropout=0.5", "model.dropout=0.25, the config has model.dropout=0.5"),
        ("trainer.jit_compile=true", "trainer.jit_compile=False, the config has trainer.jit_compile=True"),
        (
            "+stages=[{},{model: {activation: gelu}}]",
            "stages[1].model.activation='relu', the config has stages[1].model.activation='gelu'",
        ),
        ("seed=3", "seed=0, the config has seed=3"),
        ("data.shuffle=false", "data.shuffle=True, the config has data.shuffle=False"),
    ],
)
def test_a_change_of_the_math_or_the_data_stream_is_refused_naming_the_key(trained, override, message):
    text = refused(trained[0], override)
    assert text.startswith(f"the checkpoint was written with {message}; resume needs the same "), text


@pytest.mark.parametrize(
    "override, message",
    [
        ("loss=mse", "loss='sparse_categorical_crossentropy', the config has loss='mse'"),
        (
            "pipeline.batch_norm=deferred",
            "pipeline.batch_norm='microbatch', the config has pipeline.batch_norm='deferred'",
        ),
    ],
)
def test_a_change_of_the_pipeline_or_the_loss_is_refused(trained_e2e, override, message):
    text = refused(trained_e2e, *E2E, override)
    assert text.startswith(f"the checkpoint was written with {message}; resume needs the same "), text


def test_momentum_from_zero_is_refused(tmp_path):
    """SGD without momentum has no momentum slots to continue from: refused, not silently started at 0."""
    run_dir = tmp_path / "run"
    fit(run_dir, "optim=sgd", "trainer.steps=3")
    text = refused(str(run_dir), "optim=sgd", "optim.momentum=0.9")
    assert text.startswith("the checkpoint was written with optim.momentum=0.0, the config has optim.momentum=0.9"), (
        text
    )


# --- what a resume reads is verified, checkpoint.json included --------------------------------------


def tear(run_dir):
    path = os.path.join(run_dir, "checkpoint.json")
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 2])


@pytest.mark.parametrize(
    "override, message",
    [
        ("seed=1", "seed=0, the config has seed=1"),
        ("data.val_fraction=0.2", "data.val_fraction=None, the config has data.val_fraction=0.2"),
        ("data.batch_size=32", "data.batch_size=16, the config has data.batch_size=32"),
    ],
)
def test_a_torn_manifest_refuses_what_the_intact_one_refuses(copy, override, message):
    tear(copy)
    text = refused(copy, override)
    assert text.startswith(f"the checkpoint was written with {message}"), text


def test_a_torn_manifest_and_a_changed_batch_size_is_one_line_from_the_command_line(copy, tmp_path):
    tear(copy)
    r = run_cli(
        tmp_path,
        *SMALL,
        f"trainer.steps={STEPS + 3}",
        f"checkpoint.every={EVERY}",
        "data.batch_size=32",
        "resume=true",
        f"hydra.run.dir={copy}",
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert errors == [
        "error: the checkpoint was written with data.batch_size=16, the config has data.batch_size=32; "
        "resume needs the same data.batch_size: the data stream and random state continue only with "
        "the same data settings"
    ], r.stderr


def test_a_torn_manifest_keeps_the_runs_losses_and_evaluations(tmp_path):
    """What the run's evaluations had found (best loss and step: best checkpoint and early stopping
    continue from it) and its first loss come from the verified checkpoint, so a rebuilt manifest
    loses neither."""
    run_dir = str(tmp_path / "run")
    fit(run_dir, "trainer.eval_every=3")
    intact = json.load(open(os.path.join(run_dir, "checkpoint.json")))
    assert intact["loss_first"]["loss"] is not None and intact["validation"]["6"]["best_step"] in (3, 6)
    tear(run_dir)
    m = chain.build(compose("trainer.eval_every=3")).restore(run_dir)
    for key in ("loss_first", "loss_last", "validation"):
        assert m[key] == intact[key], key
    assert json.load(open(os.path.join(run_dir, "checkpoint.json")))["validation"] == intact["validation"]


def test_a_manifest_edited_to_match_the_new_settings_is_refused(copy):
    path = os.path.join(copy, "checkpoint.json")
    m = json.load(open(path))
    open(path, "w").write(json.dumps({**m, "seed": 1}))
    assert refused(copy, "seed=1").startswith("the checkpoint was written with seed=0, the config has seed=1")


def edit(run_dir, **changes):
    path = os.path.join(run_dir, "checkpoint.json")
    m = json.load(open(path))
    open(path, "w").write(json.dumps({**m, **changes}))
    return m


def restores_its_own_newest_step(run_dir, final, caplog, problem):
    """The edited manifest is not obeyed: it is rebuilt from the stage directories (a warning
    naming what was wrong), and the run's own newest step is restored."""
    caplog.set_level(logging.INFO, logger="chain")
    run = chain.build(compose())
    assert run.restore(run_dir)["step"] == STEPS
    for a, b in zip(weights(run), final, strict=True):
        np.testing.assert_array_equal(a, b)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and problem in warnings[0] and "rebuilt it from the stage directories" in warnings[0]


def test_a_manifest_edited_to_an_older_step_is_not_followed(copy, trained, caplog):
    """checkpoint.json edited to name step 3 while its newest complete step is 6."""
    edit(copy, step=3, checkpoints={k: f"{k}/ckpt-3" for k in ("stage_00", "stage_01", "data")})
    restores_its_own_newest_step(copy, trained[1], caplog, "step 3 is not the newest of the complete steps [3, 6]")


@pytest.mark.parametrize("where", ["another step", "another run"])
def test_a_manifest_pointing_at_other_files_is_not_followed(copy, trained, tmp_path, caplog, where):
    if where == "another step":
        target = "stage_00/ckpt-3"
    else:
        other = tmp_path / "other"
        fit(other, "seed=7")
        target = str(other / "stage_00" / "ckpt-6")
    m = json.load(open(os.path.join(copy, "checkpoint.json")))
    edit(copy, checkpoints={**m["checkpoints"], "stage_00": target})
    restores_its_own_newest_step(copy, trained[1], caplog, f"names {target} for stage_00 at step 6")


# --- a new run never takes over an old run's checkpoints -------------------------------------------


def test_a_new_run_refuses_a_directory_with_checkpoints_but_no_manifest(copy, trained):
    os.remove(os.path.join(copy, "checkpoint.json"))  # e.g. killed before its first manifest, or removed
    before = {f: open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(copy) for f in fs}
    with pytest.raises(CheckpointError) as e:
        fit(copy)
    assert str(e.value).startswith(
        f"{copy} already holds checkpoints (data/ckpt-3.data-00000-of-00001, ...) but no "
        "checkpoint.json; pass resume=true to continue it"
    ), str(e.value)
    assert {f: open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(copy) for f in fs} == before
    run = fit(copy, "resume=true")  # and resume=true continues it (checkpoint.json rebuilt)
    assert run.global_step == STEPS
    for a, b in zip(weights(run), trained[1], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_new_run_from_the_command_line_keeps_an_old_runs_checkpoints(copy, tmp_path):
    os.remove(os.path.join(copy, "checkpoint.json"))
    files = sorted(os.listdir(os.path.join(copy, "stage_00")))
    r = run_cli(tmp_path, *SMALL, "trainer.steps=2", f"hydra.run.dir={copy}")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"error: {copy} already holds checkpoints"), lines[0]
    assert sorted(os.listdir(os.path.join(copy, "stage_00"))) == files


def test_a_checkpoint_from_before_clipping_and_batch_norm_settings_resumes_only_under_their_old_behaviour():
    """A checkpoint written before `optim.clip_*` and `pipeline.batch_norm` existed records none of
    them: it resumes under null / microbatch (what it trained with), and is refused under anything else."""
    from chain.config import validate
    from chain.state.run_settings import RunSettings, check_resume

    settings = validate(chain.compose(SMALL + E2E))
    old = RunSettings.of(settings).values
    old = {
        **old,
        "pipeline": {k: v for k, v in old["pipeline"].items() if k != "batch_norm"},
        "stages": [
            {**s, "optim": {k: v for k, v in s["optim"].items() if not k.startswith("clip_")}} for s in old["stages"]
        ],
    }
    assert check_resume(RunSettings(old), settings, 3) == []
    for override, key in [
        ("optim.clip_global_norm=1", "optim.clip_global_norm"),
        ("pipeline.batch_norm=deferred", "pipeline.batch_norm"),
    ]:
        with pytest.raises(ChainError, match=rf"^the checkpoint was written with {key}='\(unset\)'"):
            check_resume(RunSettings(old), validate(chain.compose(SMALL + E2E + [override])), 3)


def test_pipeline_add_loss_may_change_on_resume_and_a_checkpoint_from_before_it_resumes_under_either():
    """`pipeline.add_loss` says which `add_loss` terms a run accepts, not what a step computes: a checkpoint
    written before it existed, or with the other value, resumes under either value without a note."""
    from chain.config import validate
    from chain.state.run_settings import RunSettings, check_resume

    settings = validate(chain.compose(SMALL + E2E))
    values = RunSettings.of(settings).values
    before = {**values, "pipeline": {k: v for k, v in values["pipeline"].items() if k != "add_loss"}}
    per_microbatch = validate(chain.compose(SMALL + E2E + ["pipeline.add_loss=per_microbatch"]))
    for saved in (RunSettings(before), RunSettings.of(settings), RunSettings.of(per_microbatch)):
        assert check_resume(saved, settings, 3) == [] and check_resume(saved, per_microbatch, 3) == []
