"""A run resumed on another layout: a `model=gpt` run (2 stages, GPipe, M=4, SGD with momentum) checkpointed at step 2 and
resumed to step 4 with its stages, split, schedule, microbatches, copies or plan changed ends where the run that
never stopped ends (bit for bit where every step's sums are the same, within 1e-5 where they are reordered), every
weight, optimizer slot and counter compared by layer (`chain.state.by_layer`), with the same next batch; and
AdamW's state restored into another split. (Adam is not the optimizer of the comparisons with the uninterrupted
run: it divides by the root of its second moment, so a gradient's float noise moves a weight by O(lr) wherever the
gradient is zero but for that noise (an attention key bias), and copies of the pipeline alone, in a run that never
stopped, differ from one copy by 0.3 of a weight after 4 steps. Tensors are compared relative to their largest
value or to 1e-3, whichever is larger.)
In-process, on the test session's logical devices; one uninterrupted run per module."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

import chain
from chain.state import by_layer

STEPS, SAVED = 4, 2
GPT = [
    "mode=e2e",
    "model=gpt",
    "data=text",
    "data.seq_len=8",
    "data.batch_size=16",
    "model.width=8",
    "model.heads=2",
    "model.depth=1",
    "model.dropout=0.0",
    "optim=sgd",  # with momentum: slots to carry over; Adam magnifies reordered sums (see below)
    "optim.momentum=0.9",
    "optim.lr=0.1",
    "+stages=2",
    "pipeline.schedule=gpipe",
    "pipeline.microbatches=4",
    "trainer.progress=false",
    "checkpoint.export=false",
    f"checkpoint.every={SAVED}",
]


def state(run) -> dict[str, np.ndarray]:
    """The chain's state by layer: every weight, slot and seed state, whatever its stage, and the step count."""
    out = {
        f"{k}/{n}": v.numpy() for keyed in by_layer.keyed(run.stages) for k, vs in keyed.items() for n, v in vs.items()
    }
    (out["iterations"],) = {int(s.optimizer.iterations.numpy()) for s in run.stages}
    return out


def compose(corpus, *overrides):
    """GPT's run on `corpus`, `overrides` on top (another optimizer: SGD's keys left out)."""
    keep = [o for o in GPT if not (o.startswith("optim") and any(x.startswith("optim=") for x in overrides))]
    return chain.compose([*keep, f"data.path={corpus}", *overrides])


def fit(run_dir, corpus, *overrides, steps=STEPS):
    run = chain.build(compose(corpus, f"trainer.steps={steps}", *overrides), run_dir=str(run_dir))
    run.fit()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run's state and next batch, and a run stopped at its checkpoint of step 2."""
    d = tmp_path_factory.mktemp("layout")
    (d / "a.txt").write_text("the quick brown fox jumps over the lazy dog; naïve café\n" * 30)
    corpus = str(d / "a.txt")
    straight = fit(d / "straight", corpus)
    fit(d / "stopped", corpus, steps=SAVED)
    return corpus, str(d / "stopped"), state(straight), next(straight.iterator)[0].numpy()


CHANGES = {  # what changes on resume -> exact: bit for bit with the uninterrupted run (else within 1e-5)
    "+stages=4": ("4 stages (layers 3+3+4+2) gpipe M=4", True),
    "pipeline.schedule=1f1b": ("2 stages 1f1b M=4", True),
    "pipeline.schedule=zb1": ("2 stages zb1 M=4", True),
    "pipeline.schedule=zbv": ("2 stages zbv M=4", False),  # the tied weight borrowed, not copied: summed otherwise
    "placement.balance=params": (None, True),  # the same split as even here: nothing moved, nothing said
    "placement.split=[4,8]": ("2 stages (layers 4+8)", False),  # other per-stage graphs: their rounding differs
    "pipeline.microbatches=8": ("2 stages gpipe M=8", False),
    "placement.replicas=2": ("2 stages gpipe M=4 x2 copies", False),
    "placement.plan=auto": ("", False),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_run_resumed_on_another_layout_ends_where_the_uninterrupted_run_ends(runs, tmp_path, caplog, change):
    corpus, stopped, want, next_batch = runs
    run_dir = tmp_path / "run"
    shutil.copytree(stopped, run_dir)
    with caplog.at_level(logging.INFO, logger="chain"):
        resumed = fit(run_dir, corpus, change, "resume=true")
    said, exact = CHANGES[change]
    moved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed step 2: ")]
    assert len(moved) == (said is not None) and all(m.startswith("resumed step 2: 2 stages") for m in moved), moved
    assert all(said in m.partition(" -> ")[2] for m in moved), moved
    got = state(resumed)
    assert got.keys() == want.keys()
    for key in want:
        if exact or not np.issubdtype(np.asarray(want[key]).dtype, np.floating):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        else:  # relative to the tensor's largest value, or to 1e-3 for the attention key biases' float noise
            assert np.max(np.abs(got[key] - want[key])) <= 1e-5 * max(np.max(np.abs(want[key])), 1e-3), key
    np.testing.assert_array_equal(next(resumed.iterator)[0].numpy(), next_batch)  # the same examples, in order
    with open(os.path.join(run_dir, "summary.json")) as f:
        layouts = json.load(f)["layouts"]
    assert [entry["step"] for entry in layouts] == [0, SAVED] if said is not None else [0]
    assert layouts[0]["stages"] == 2 and layouts[0]["schedule"] == "gpipe" and layouts[0]["microbatches"] == 4


def test_adamws_state_restores_into_another_split_weight_by_weight(runs, tmp_path):
    """A checkpoint of 2 stages restored into 4: every weight, both Adam slots and the counters, bit for bit."""
    corpus = runs[0]
    saved = fit(tmp_path / "adamw", corpus, "optim=adamw", steps=1)
    restored = chain.build(compose(corpus, "optim=adamw", "+stages=4"))
    restored.restore(str(tmp_path / "adamw"))
    want, got = state(saved), state(restored)
    assert got.keys() == want.keys() and any(k.endswith("/velocities") for k in got)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize(
    "override, key",
    [("model.width=16", "model.width"), ("data.batch_size=32", "data.batch_size"), ("optim.momentum=0.5", None)],
)
def test_a_change_of_the_model_or_the_data_on_another_layout_is_refused_in_one_line(runs, override, key):
    """On 4 stages as on 2: what changes the model or the data stream is one line naming the key; nothing
    is restored. (A momentum may change: it applies from the resumed step, with a note.)"""
    corpus, stopped = runs[0], runs[1]
    run = chain.build(compose(corpus, "+stages=4", override))
    before = state(run)
    if key is None:
        run.restore(stopped)
        assert run.global_step == SAVED
        return
    with pytest.raises(chain.ChainError) as e:
        run.restore(stopped)
    assert str(e.value).startswith(f"the checkpoint was written with {key}=") and "\n" not in str(e.value)
    assert f"resume needs the same {key}" in str(e.value)
    for k, v in state(run).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
