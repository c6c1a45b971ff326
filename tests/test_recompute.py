"""pipeline.recompute: a recomputed stage trains exactly as one that keeps its activations.

One chain per case is built once; each policy and schedule is a new step over the same stages
(`Strategy.set_step`), started from the same variables (weights, optimizer, dropout seeds and
batch-norm statistics) and fed the same batches. Recomputation replays the same ops on the
same values, so the tests ask for bit-for-bit equality, not a tolerance.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import keras
import numpy as np
import pytest

import chain
from chain.schedule import schedules
from chain.pipeline import play
from chain.pipeline.play import e2e_step
from chain.steps import recompute
from conftest import EXTENDED
from graph_audit import live_ops

STEPS = 2
_REPLAY = play.replay
BASE = [
    "+stages=2",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "model.dropout=0.3",
    "optim=sgd",
    "optim.lr=0.1",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=64",
    "data.batch_size=16",
    "data.shuffle=false",
    "pipeline.microbatches=4",
]


class Replayer:
    """Steps of one built chain under any schedule and policy, each from the same start."""

    def __init__(self, run):
        self.run = run
        self.variables = [v for s in run.stages for v in list(s.model.variables) + list(s.optimizer.variables)]
        self.start = [v.numpy() for v in self.variables]
        it = iter(run.batches())
        self.batches = [next(it) for _ in range(STEPS)]
        self.played: dict[tuple, tuple] = {}

    def play(self, schedule: str, m: int, policy: str) -> tuple[list[float], list[np.ndarray]]:
        """The losses of STEPS steps and every variable after them (played once per case)."""
        if (schedule, m, policy) not in self.played or play.replay is not _REPLAY:
            self.played[(schedule, m, policy)] = self._play(schedule, m, policy)
        return self.played[(schedule, m, policy)]

    def _play(self, schedule: str, m: int, policy: str) -> tuple[list[float], list[np.ndarray]]:
        for v, value in zip(self.variables, self.start):
            v.assign(value)
        st, run = self.run.strategy, self.run
        st.set_step(
            e2e_step(
                run.stages,
                self.plan(schedule, m),
                st.loss_fn(),
                st.target,
                jit_compile=run.settings.trainer.jit_compile,
                recompute_policy=policy,
            )
        )
        losses = [run.step(*b)["loss"] for b in self.batches]
        return losses, [v.numpy() for v in self.variables]

    def plan(self, schedule: str, m: int) -> schedules.Schedule:
        """The built-in `schedule` with `m` microbatches over this chain (interleaved: stage k on device
        k mod the devices the stages use)."""
        devices = len({s.device for s in self.run.stages})
        return schedules.build(schedule, len(self.run.stages), m, devices if schedule == "interleaved" else None)

    def matmuls(self, schedule: str, m: int, policy: str) -> dict[tuple[str, int], int]:
        """How many MatMul ops a call of the step runs per (action kind, stage): the work, counted."""
        st, run = self.run.strategy, self.run
        st.set_step(e2e_step(run.stages, self.plan(schedule, m), st.loss_fn(), st.target, recompute_policy=policy))
        graph = run.trace(*self.batches[0]).graph
        alive = live_ops(graph)
        actions = [
            schedules.Action.parse(op.name) for op in graph.get_operations() if op.type == "MatMul" and op.name in alive
        ]
        counts: dict[tuple[str, int], int] = {}
        for a in actions:
            if a is not None:
                counts[(a.kind, a.stage)] = counts.get((a.kind, a.stage), 0) + 1
        return counts

    def assert_equal(self, got, want) -> None:
        assert got[0] == want[0]
        for a, b in zip(got[1], want[1], strict=True):
            np.testing.assert_array_equal(a, b)
        # Training moved the weights: equality is not trivial.
        trainable = {id(v) for s in self.run.stages for v in s.trainable_variables}
        assert (
            max(
                float(np.max(np.abs(a - a0)))
                for v, a, a0 in zip(self.variables, got[1], self.start)
                if id(v) in trainable
            )
            > 1e-2
        )


@pytest.fixture(scope="module")
def mlp():
    return Replayer(chain.build(chain.compose(BASE)))


@pytest.mark.parametrize(
    "schedule, m, policies",
    [("gpipe", 4, ("always",)), ("1f1b", 2, ("always", "except_last")), ("gpipe", 1, ("always",))],
)
def test_recomputed_stages_train_bit_for_bit_like_stages_that_keep_activations_dropout_included(
    mlp, schedule, m, policies
):
    never = mlp.play(schedule, m, "never")
    for policy in policies:
        mlp.assert_equal(mlp.play(schedule, m, policy), never)


def test_a_replay_without_the_models_state_draws_other_dropout_masks(mlp, monkeypatch):
    """The control: the dropout above matters, so the replayed seed state is what makes them equal."""
    never = mlp.play("gpipe", 4, "never")
    monkeypatch.setattr(play, "replay", lambda model, saved, forward: forward())
    naive = mlp.play("gpipe", 4, "always")
    assert naive[0][0] != never[0][0] or any(not np.array_equal(a, b) for a, b in zip(naive[1], never[1]))


@EXTENDED  # the suite's time: gpipe's and 1f1b's stages (always and except_last) recompute bit for bit every time
def test_interleaved_stages_recompute_bit_for_bit_like_stages_that_keep_activations():
    r = Replayer(
        chain.build(
            chain.compose(
                [o.replace("+stages=2", "+stages=4") for o in BASE]
                + ["pipeline.schedule=interleaved", "pipeline.virtual_stages=2"]
            )
        )
    )
    assert len({s.device for s in r.run.stages}) == 2
    assert sum(r.matmuls("interleaved", 4, "always").values()) > sum(r.matmuls("interleaved", 4, "never").values())
    never = r.play("interleaved", 4, "never")
    for policy in ("always", "except_last"):
        r.assert_equal(r.play("interleaved", 4, policy), never)


def test_recompute_with_float16_and_xla_matches_keeping_activations():
    r = Replayer(chain.build(chain.compose(BASE + ["precision=mixed_float16", "trainer.jit_compile=true"])))
    r.assert_equal(r.play("1f1b", 2, "always"), r.play("1f1b", 2, "never"))


def test_recompute_of_a_cut_keras_model_with_batch_norm_updates_its_statistics_once():
    keras.utils.set_random_seed(3)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="d1")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.3, name="drop")(h)
    h = keras.layers.Dense(8, activation="relu", name="d2")(h)
    model = keras.Model(x, keras.layers.Dense(4, name="out")(h))
    over = [o for o in BASE if not o.startswith("model.")] + ["placement.split=[3,2]"]
    r = Replayer(chain.build(chain.compose(over), model=model))
    never = r.play("gpipe", 2, "never")
    r.assert_equal(r.play("gpipe", 2, "always"), never)  # moving mean and variance included


def test_recompute_is_a_pipeline_setting_with_three_values():
    assert chain.compose(BASE + ["pipeline.recompute=except_last"]).pipeline.recompute == "except_last"
    from chain.errors import ConfigError

    with pytest.raises(ConfigError, match="pipeline.recompute"):
        chain.compose(BASE + ["pipeline.recompute=sometimes"])
    assert [recompute.recomputed(p, m, 4) for p in ("never", "except_last", "always") for m in (0, 3)] == [
        False,
        False,
        True,
        False,
        True,
        True,
    ]


@pytest.mark.parametrize("schedule, last_forwards", [("1f1b", "in F"), ("gpipe", "in B")])
def test_recomputation_adds_one_forward_on_each_stage_before_the_last_and_none_on_the_last(
    mlp, schedule, last_forwards
):
    """`always` adds exactly one forward's products per microbatch on a stage before the last, none to
    its forwards. The last stage's output goes nowhere but into its loss: under 1F1B each backward runs
    right after its forward, and a replay would only rebuild what the tape holds then (it keeps it);
    under GPipe its F keeps only the input and B runs the forward, once. Either way it runs the
    products of `never`, no more."""
    never, always = (mlp.matmuls(schedule, 2, p) for p in ("never", "always"))
    last = len(mlp.run.stages) - 1
    for k in range(last):
        assert always[("F", k)] == never[("F", k)], k
        assert always[("B", k)] == never[("B", k)] + never[("F", k)], (k, never, always)
    assert always.get(("F", last), 0) + always[("B", last)] == never[("F", last)] + never[("B", last)], (never, always)
    assert always.get(("F", last), 0) == (never[("F", last)] if last_forwards == "in F" else 0), always


def test_a_backward_computes_each_layers_weight_gradients_before_going_on_past_it_with_the_same_bits(mlp):
    """`step.weights_first`: the product that carries a layer's gradient on to its input waits for that
    layer's weight product, so a backward does not hold every layer's gradient at once (the memory trace
    of GPipe `always`, docs/benchmarks.md). Only the order changes: the same bits as without the edges (left
    out by patching, as a benchmark does: scripts/ablations.py)."""
    run, st = mlp.run, mlp.run.strategy
    plan = schedules.build("gpipe", len(run.stages), 4)

    def early_or_late(early: bool):
        late = {"weights_first": lambda weight_grads, ops: 0, "summed_in_turn": lambda sums, done: []}
        return contextlib.ExitStack() if early else mock.patch.multiple(play, **late)

    def waits(early: bool) -> list[bool]:
        st.set_step(e2e_step(run.stages, plan, st.loss_fn(), st.target, recompute_policy="always"))
        with early_or_late(early):
            ops = {op.name: op for op in run.trace(*mlp.batches[0]).graph.get_operations()}
        # TensorFlow's MatMul gradient: `.../MatMul` the input's gradient, `.../MatMul_1` the kernel's
        return [
            ops[name[: -len("MatMul")] + "MatMul_1"] in op.control_inputs
            for name, op in ops.items()
            if name.startswith("gradient_tape/")
            and name.endswith("/MatMul/MatMul")
            and name[: -len("MatMul")] + "MatMul_1" in ops
        ]

    early, late = waits(True), waits(False)
    assert early and all(early), early
    assert not any(late), late
    played = {}
    for flag in (True, False):
        for v, value in zip(mlp.variables, mlp.start):
            v.assign(value)
        st.set_step(e2e_step(run.stages, plan, st.loss_fn(), st.target, recompute_policy="always"))
        with early_or_late(flag):
            played[flag] = ([run.step(*b)["loss"] for b in mlp.batches], [v.numpy() for v in mlp.variables])
    mlp.assert_equal(played[True], played[False])
