"""Issue 51's composition table: three language models (`model=gpt`, keras_hub's GPT2CausalLM, a user's masked
encoder) x every schedule of `chain.schedule.schedules.BUILDERS` x {one pipeline, 2 copies} x {recompute, global
clipping, mixed_bfloat16, AdamW with a warm-up}. Each cell trains like the same model on one device (one stage on
one device, the whole batch at once, the same feature; recompute's oracle computes without it) or is refused in
one line. The oracle is made once per model and feature and shared by the cells. `EXPECTED` is the table as data:
docs/language-models.md shows it, and a test checks that the two agree.

Equal: 3 steps' losses and every weight (per variable, `rel_diff`) within 1e-5, attention's key bias left out (its
gradient is 0 in exact arithmetic: what moves it is float noise); mixed_bfloat16 against the one-device run in bfloat16
within tests/test_precision.py's tolerance, 2u (u = 2^-8), the losses relative and the weights in norm."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import chain
from chain.schedule import schedules
from compare import norm_rel_diff, paths, rel_diff
from conftest import EXTENDED

MODELS = {"gpt": "model=gpt", "gpt2": "GPT2CausalLM", "masked": "masked encoder"}
SCHEDULES = tuple(schedules.BUILDERS)
TOPOLOGIES = {"pipeline": [], "copies": ["placement.replicas=2"]}
FEATURES = {
    "recompute": ["pipeline.recompute=always"],
    "clip": ["optim.clip_global_norm=0.05"],
    "bf16": ["precision=mixed_bfloat16"],
    "adamw": ["optim=adamw", "optim.lr=0.01", "optim.schedule=warmup_cosine", "optim.warmup_steps=2"],
}
# The table's words for them (docs/language-models.md)
TOPOLOGY_NAMES = {"pipeline": "1 pipeline", "copies": "2 copies"}
FEATURE_NAMES = {
    "recompute": "recompute=always",
    "clip": "clip_global_norm",
    "bf16": "mixed_bfloat16",
    "adamw": "AdamW + warm-up",
}
STEPS, MICROBATCHES = 3, 2
BF16_ROUNDOFF = 2.0**-8  # u; tests/test_precision.py holds bfloat16 to 2u

# Each cell's outcome, (model, schedule, topology, feature) -> "=" (trains like one device) or the table's
# "refused: ..."; `REFUSALS` gives the part of chain's one line that each refusal must hold.
SPLIT = "refused: split backward"  # zb1, zbv: W needs what the forward kept
REFUSALS = {SPLIT: "is not available with a split backward"}
EXPECTED: dict[tuple[str, str, str, str], str] = {
    (m, s, t, f): SPLIT if f == "recompute" and schedules.BUILDERS[s].split else "="
    for m, s, t, f in itertools.product(MODELS, SCHEDULES, TOPOLOGIES, FEATURES)
}
# Every run: every refusal (before TensorFlow builds anything) and 2 trained cells, the copies' sparse gradients
# under clipping and AdamW. The suite's 15 minutes cannot carry more (a cell and its oracle: about 5 s of CPU).
# The rest run with CHAIN_TEST_ZOO=all.
EVERY_RUN = {
    ("gpt", "gpipe", "copies", "clip"),
    ("masked", "sequential", "copies", "adamw"),
}


def stage_overrides(schedule: str) -> list[str]:
    """2 stages, one per device; a schedule of two stages per device (interleaved, zbv) 4 on the same 2."""
    row = schedules.BUILDERS[schedule]
    if row.per_device == 1:
        return ["+stages=2"]
    return ["+stages=4", *(["pipeline.virtual_stages=2"] if row.per_device is None else [])]


@dataclass(frozen=True)
class Lm:
    """A model of the table: its config, the user's model (None: `model=gpt`), its batches, its cut into k stages."""

    config: list[str]
    make: Callable | None
    batches: Callable[[], list]
    cut: Callable[[int], list[str]] = lambda k: []


def gpt_batches() -> list:
    rng = np.random.default_rng(0)
    return [
        (rng.integers(0, 256, (8, 8)).astype("int32"), rng.integers(0, 256, (8, 8)).astype("int32"))
        for _ in range(STEPS)
    ]


def language_models(tmp: Path) -> dict[str, Lm]:
    """`model=gpt` (width 8, 2 blocks, bytes; tied read-out), GPT2CausalLM as tests/test_keras_hub.py makes it
    (per token, padding ignored) and tests/test_structured_cuts.py's masked encoder (one label per example)."""
    import test_keras_hub as hub
    import test_structured_cuts as masked

    (tmp / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    gpt = ["model=gpt", "data=text", f"data.path={tmp / 'a.txt'}", "data.seq_len=8", "data.batch_size=8"]
    x = masked.padded(tmp / "tokens.npz")
    return {
        "gpt": Lm([*gpt, "model.width=8", "model.heads=2", "model.depth=2"], None, gpt_batches),
        "gpt2": Lm(
            [o for o in hub.per_token_data() if o.startswith(("data", "ignore_class"))],
            hub.gpt2_lm,
            lambda: hub.token_batches(STEPS),
            lambda k: hub.between_blocks(hub.gpt2_lm, k),
        ),
        "masked": Lm(
            ["data=npz", f"data.path={tmp / 'tokens.npz'}", "data.y=y", "data.batch_size=16", "data.shuffle=false"],
            masked.masked_encoder,
            lambda: [(x[k : k + 16], np.random.default_rng(k).integers(0, masked.CLASSES, 16)) for k in (0, 16, 32)],
        ),
    }


COMMON = ["mode=e2e", "optim=sgd", "optim.lr=0.1", "trainer.progress=false", "checkpoint.export=false"]


def build(lm: Lm, overrides: list[str]):
    cfg = chain.compose([*COMMON, *lm.config, *overrides])
    return chain.build(cfg) if lm.make is None else chain.build(cfg, model=lm.make())


@dataclass(frozen=True)
class Trained:
    """A run's steps: each step's loss, and every trainable variable by path (a tied weight once) before and
    after them."""

    losses: np.ndarray
    start: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]


def by_path(run) -> dict[str, np.ndarray]:
    variables = [v for s in run.stages for v in s.trainable_variables]
    tied = {c.name for s in run.stages for c in s.shared}
    return {p: v.numpy() for p, v in zip(paths(variables, tied=tied), variables)}


def train(run, batches) -> Trained:
    start, target = by_path(run), run.stages[-1].target.name
    losses = np.array([float(run.step(x, {target: y})["loss"]) for x, y in batches])
    return Trained(losses, start, by_path(run))


@pytest.fixture(scope="module")
def lms(tmp_path_factory) -> dict[str, Lm]:
    return language_models(tmp_path_factory.mktemp("composition"))


@pytest.fixture(scope="module")
def oracles(lms) -> Callable[[str, str], Trained]:
    """`oracle(model, feature)`: the model on one stage of one device, the whole batch at once, with the feature
    (recompute: without, as it computes the same), trained on the cells' batches; each made once."""
    made: dict[tuple[str, str], Trained] = {}

    def oracle(model: str, feature: str) -> Trained:
        if (model, feature) not in made:
            over = [] if feature == "recompute" else FEATURES[feature]
            run = build(lms[model], ["+stages=1", "pipeline.schedule=sequential", "pipeline.microbatches=1", *over])
            made[model, feature] = train(run, lms[model].batches())
        return made[model, feature]

    return oracle


def cell_overrides(lm: Lm, schedule: str, topology: str, feature: str) -> list[str]:
    stages = stage_overrides(schedule)
    return [
        *stages,
        *lm.cut(int(stages[0].split("=")[1])),
        f"pipeline.schedule={schedule}",
        f"pipeline.microbatches={MICROBATCHES}",
        *TOPOLOGIES[topology],
        *FEATURES[feature],
    ]


def difference(got: Trained, want: Trained, feature: str) -> float:
    """The largest difference of the weights: per variable (`rel_diff`) or, bfloat16, of all in norm."""
    keys = [p for p in want.weights if not p.endswith("key/bias")]
    if feature == "bf16":
        return norm_rel_diff(*(np.concatenate([t.weights[p].ravel() for p in keys]) for t in (got, want)))
    return max(rel_diff(got.weights[p], want.weights[p]) for p in keys)


def cells():
    for cell in itertools.product(MODELS, SCHEDULES, TOPOLOGIES, FEATURES):
        cheap = cell in EVERY_RUN or EXPECTED[cell] != "="
        yield pytest.param(*cell, id="-".join(cell), marks=() if cheap else EXTENDED)


@pytest.mark.parametrize("model, schedule, topology, feature", list(cells()))
def test_each_cell_trains_like_one_device_or_is_refused_in_one_line(lms, oracles, model, schedule, topology, feature):
    lm, want = lms[model], EXPECTED[model, schedule, topology, feature]
    overrides = cell_overrides(lm, schedule, topology, feature)
    if want != "=":
        with pytest.raises(chain.ConfigError) as e:
            chain.compose([*COMMON, *lm.config, *overrides])
        assert REFUSALS[want] in str(e.value) and "\n" not in str(e.value)
        return
    run = build(lm, overrides)
    ref = oracles(model, feature)
    got = train(run, lm.batches())
    assert got.weights.keys() == ref.weights.keys()
    for p, w in got.start.items():
        np.testing.assert_array_equal(w, ref.start[p])  # the same model from the same seed
    tolerance = 2 * BF16_ROUNDOFF if feature == "bf16" else 1e-5
    loss, weights = float(np.max(np.abs(got.losses - ref.losses) / np.abs(ref.losses))), difference(got, ref, feature)
    print(f"cell {model}-{schedule}-{topology}-{feature}: losses {loss:.1e}, weights {weights:.1e}")
    assert loss <= tolerance and weights <= tolerance
    assert max(rel_diff(ref.weights[p], ref.start[p]) for p in ref.weights) > 1e-3  # training moved the weights


def documented() -> dict[tuple[str, str], str]:
    """docs/language-models.md's table of features together: (row, column) -> cell."""
    text = (Path(__file__).parents[1] / "docs" / "language-models.md").read_text()
    section = text.split("\n## Features together", 1)[1]
    table = itertools.takewhile(lambda line: line.startswith("|"), section[section.index("\n|") + 1 :].splitlines())
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    header, body = rows[0], rows[2:]
    return {(row[0], column): cell for row in body for column, cell in zip(header[1:], row[1:], strict=True)}


def test_the_docs_table_says_what_each_cell_is_expected_to_do():
    """Every cell of the table: "= D" (D the largest difference measured, within the cell's tolerance) where
    EXPECTED says it trains, else the refusal's words."""
    doc = documented()
    want = {
        (f"{MODELS[m]}, {FEATURE_NAMES[f]}", f"{s}, {TOPOLOGY_NAMES[t]}"): outcome
        for (m, s, t, f), outcome in EXPECTED.items()
    }
    assert doc.keys() == want.keys()
    for (row, column), outcome in want.items():
        cell = doc[row, column]
        if outcome != "=":
            assert cell == outcome, (row, column, cell)
            continue
        tolerance = 2 * BF16_ROUNDOFF if FEATURE_NAMES["bf16"] in row else 1e-5
        assert cell.startswith("= ") and float(cell[2:]) <= tolerance, (row, column, cell)


def test_the_mirrored_fallback_keeps_an_embeddings_sparse_gradient_under_adamw(lms, oracles):
    """The masked encoder's embedding gradient is sparse (rows of the ids seen); AdamW updates only those rows
    (Keras' sparse update). Under the mirrored fallback (the whole network on each of 2 devices, tf.distribute
    joining the replicas' gradients) it trains like one device: a dense join would move every row's moments
    (copies of the pipeline did, 1.4e-1 off, before `replicas.joined_mean`)."""
    from chain.strategies.mirrored import Mirrored

    lm = lms["masked"]
    run = build(lm, ["+stages=2", "placement.fallback=mirrored", *FEATURES["adamw"]])
    assert isinstance(run.strategy, Mirrored) and run.strategy.tf_strategy.num_replicas_in_sync == 2
    want, got = oracles("masked", "adamw"), train(run, lm.batches())
    assert np.max(np.abs(got.losses - want.losses) / np.abs(want.losses)) <= 1e-5
    assert difference(got, want, "adamw") <= 1e-5
