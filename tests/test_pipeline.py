"""mode=e2e: every schedule trains the chain exactly like one Keras model on one device,
with each stage's work on its own device and nothing crossing devices but the copies."""

from __future__ import annotations

import json
import os
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.schedule import schedules
from chain.pipeline import play
from chain.planning import memory
from chain.planning.devices import canonical
from conftest import DEVICES
from graph_audit import audit, live_ops
from compare import rel_diff

STEPS = 5
LR = 0.1
K = 3
# A 3-stage MLP chain, small enough to trace nine times: 6 -> 8 -> 8 -> 8 -> read-out.
BASE = [
    "+stages=3",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "optim=sgd",
    f"optim.lr={LR}",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
]
LOSSES = {  # name -> (overrides, Keras' own loss on (y, output of the last stage))
    "crossentropy": ([], lambda y, out: keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, out)),
    "mse_value": (["loss=mse", "stage.target=value"], lambda y, out: keras.losses.MeanSquaredError()(y, out[:, 0])),
    "mse_onehot": (["loss=mse"], lambda y, out: keras.losses.MeanSquaredError()(tf.one_hot(y, 4), out)),
}
CASES = (
    [(name, m, "crossentropy") for name in ("sequential", "gpipe", "1f1b") for m in (1, 2, 4)]
    + [("zb1", m, "crossentropy") for m in (2, 4, 8)]
    + [("eager1f1b", 8, "crossentropy")]
    + [("1f1b", 2, "mse_value"), ("gpipe", 4, "mse_onehot")]
)


def keras_reference(run, initial: list[list[np.ndarray]], loss):
    """One `keras.Sequential` on one device holding copies of the chain's layers and initial weights."""
    with tf.device(DEVICES[0]):
        layers = []
        for s in run.stages:
            for layer in s.model.layers:
                cfg = layer.get_config()
                cfg.pop("name")  # unique names in one model
                layers.append(layer.__class__.from_config(cfg))
        model = keras.Sequential([keras.Input(run.dataset.input_shape)] + layers)
        for layer, weights in zip(layers, [w for stage in initial for w in stage]):
            layer.set_weights(weights)
        opt = keras.optimizers.SGD(learning_rate=LR)
        opt.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.device(DEVICES[0]):
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            grads = tape.gradient(value, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    return model, layers, step


# Interleaved: 4 stages, 2 per device (stage k on device k mod 2).
INTERLEAVED = [o for o in BASE if o != "+stages=3"] + ["+stages=4", "pipeline.virtual_stages=2"]
# zbv: 4 stages on 2 devices in a V (stages 0 and 3 on the first, 1 and 2 on the second).
ZBV = [o for o in BASE if o != "+stages=3"] + ["+stages=4"]
BASES = {"interleaved": INTERLEAVED, "zbv": ZBV}  # the schedules whose stages share devices; the rest: BASE


def train_case(schedule: str, m: int, loss: str) -> dict:
    """Build the chain for one case, train it and the Keras reference 5 steps."""
    overrides, keras_loss = LOSSES[loss]
    base = BASES.get(schedule, BASE)
    run = chain.build(chain.compose(base + overrides + [f"pipeline.schedule={schedule}", f"pipeline.microbatches={m}"]))
    initial = [[layer.get_weights() for layer in s.model.layers] for s in run.stages]
    model, layers, ref_step = keras_reference(run, initial, keras_loss)
    target = run.stages[-1].target.name
    it = iter(run.batches())
    chain_losses, ref_losses = [], []
    for _ in range(STEPS):
        x, ys = next(it)
        chain_losses.append(run.step(x, ys)["loss"])
        ref_losses.append(float(ref_step(x, ys[target])))
    return dict(
        run=run, initial=initial, layers=layers, chain_losses=chain_losses, ref_losses=ref_losses, batch=(x, ys)
    )


@pytest.fixture(scope="module")
def trained():
    """`trained(schedule, m, loss)`: that case built and trained once for this module's tests."""
    cases: dict = {}

    def get(schedule: str, m: int, loss: str) -> dict:
        if (schedule, m, loss) not in cases:
            cases[(schedule, m, loss)] = train_case(schedule, m, loss)
        return cases[(schedule, m, loss)]

    return get


def assert_trained_like_keras(t) -> None:
    """The chain's losses and every layer's weights equal the one-device Keras model's (<= 1e-5),
    and training moved the weights far more than the tolerance (equality is not trivial)."""
    np.testing.assert_allclose(t["chain_losses"], t["ref_losses"], rtol=1e-5)
    ref_layers = iter(t["layers"])
    for s, initial in zip(t["run"].stages, t["initial"]):
        for layer, before in zip(s.model.layers, initial):
            ref = next(ref_layers)
            for w, r, w0 in zip(layer.get_weights(), ref.get_weights(), before):
                assert rel_diff(w, r) <= 1e-5, (s.index, layer.name)
                assert rel_diff(w, w0) > 1e-3, (s.index, layer.name)
    assert next(ref_layers, None) is None


@pytest.mark.parametrize("schedule, m, loss", CASES)
def test_every_schedule_trains_like_one_keras_model_on_one_device(trained, schedule, m, loss):
    t = trained(schedule, m, loss)
    run = t["run"]
    assert [s.device for s in run.stages] == DEVICES[:K]
    assert run.schedule.name == schedule and run.schedule.microbatches == m
    assert_trained_like_keras(t)


def stage_of(op_name: str) -> int | None:
    """The stage an op of the pipeline belongs to, from its action scope (`s1_F0/...`,
    `gradient_tape/s1_F0/...`) or its optimizer's (`optim_01/...`, inside the guard's branch)."""
    head = op_name.removeprefix("gradient_tape/").split("/")[0]
    if head.startswith("optim_") and head[6:8].isdigit():
        return int(head[6:8])
    if head.startswith("s") and "_" in head and head[1 : head.index("_")].isdigit():
        return int(head[1 : head.index("_")])
    return None


@pytest.mark.parametrize("schedule", [n for n in schedules.NAMES if n not in BASES])  # a device per stage
def test_compiled_step_keeps_stage_k_on_device_k_and_copies_are_the_only_crossings(trained, schedule):
    m = 2
    t = trained(schedule, m, "crossentropy")
    run, (x, ys) = t["run"], t["batch"]
    a = audit(run.trace(x, ys))
    devices = [s.device for s in run.stages]
    assert a.misplaced(devices) == []
    for k, device in enumerate(devices):
        mine = [op for op in a.ops() if stage_of(a.name(op)) == k and op.type != "Placeholder"]
        forward = [op for op in mine if a.name(op).startswith(f"s{k}_F") and op.type == "MatMul"]
        backward = [op for op in mine if a.name(op).startswith(f"gradient_tape/s{k}_F") and op.type == "MatMul"]
        # The numerics guard puts each update inside a `tf.cond` branch, which the audit walks.
        # (Keras' update assigns; a fused one, optim.fused, is one ResourceApply* op per variable.)
        updates = [
            op
            for op in mine
            if a.name(op).startswith(f"optim_{k:02d}/") and op.type.startswith(("Assign", "ResourceApply"))
        ]
        assert len(forward) == m * len(run.stages[k].model.layers)  # one MatMul per Dense per microbatch
        assert backward and updates
        assert {a.device[op] for op in mine} == {device}, k
    crossings = a.crossings()
    assert all(c.name.split("/")[-1].startswith("copy_to_") for c, _ in crossings), crossings
    # Each earlier stage's guard flag travels to the last stage, into the step's one report.
    reports = a.report_copies()
    assert sorted(op.name.split("/")[-1] for op in reports) == [f"copy_to_report_s{k}" for k in range(K - 1)]
    assert {a.device[c] for c in reports} == {devices[-1]}
    crossings = [(c, p) for c, p in crossings if c not in reports]
    assert len(crossings) == 2 * (K - 1) * m
    names = sorted(op.name.split("/")[-1] for op in a.copies() if op not in reports)
    expected = sorted(
        [f"copy_to_{play.activation_copy(k, mb)}" for k in range(1, K) for mb in range(m)]
        + [f"copy_to_{play.gradient_copy(k, mb)}" for k in range(K - 1) for mb in range(m)]
        + ["copy_to_input", "copy_to_labels"]
    )
    assert names == expected
    for consumer, producer in crossings:  # activations go k -> k+1, gradients k+1 -> k
        src, dst = devices.index(a.device[producer]), devices.index(a.device[consumer])
        assert dst - src == (1 if "copy_to_act" in consumer.name else -1)


def action_ops(graph_ops, action: schedules.Action) -> list:
    k, mb, kind = action.stage, action.microbatch, action.kind
    prefixes = (f"s{k}_F{mb}/",) if kind == "F" else (f"s{k}_B{mb}/", f"gradient_tape/s{k}_F{mb}/")
    return [op for op in graph_ops if op.name.startswith(prefixes) and op.type != "Placeholder"]


def ancestor_sets(ops) -> dict[str, set[str]]:
    """Op name -> names of every op it waits for through data or control edges."""
    ancestors: dict[str, set[str]] = {}
    for root in ops:
        stack = [(root, False)]
        while stack:  # iterative post-order: parents first
            op, expanded = stack.pop()
            if op.name in ancestors:
                continue
            parents = [i.op for i in op.inputs] + list(op.control_inputs)
            if expanded:
                ancestors[op.name] = set().union(*[ancestors[p.name] | {p.name} for p in parents])
            else:
                stack.append((op, True))
                stack.extend((p, False) for p in parents if p.name not in ancestors)
    return ancestors


def step_graph(t: dict) -> tuple:
    """(run, the compiled step's ops, each op's ancestors) of a trained case."""
    run, (x, ys) = t["run"], t["batch"]
    ops = run.trace(x, ys).graph.get_operations()
    return run, ops, ancestor_sets(ops)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_runs_its_actions_in_schedule_order(trained, schedule):
    """Every op of a stage's action waits (data or control edge) for the end of its previous action."""
    run, ops, ancestors = step_graph(trained(schedule, 2, "crossentropy"))
    for row in run.schedule.actions:
        for before, after in zip(row, row[1:]):
            prev = action_ops(ops, before)
            names = {op.name for op in prev}
            # The ends of the previous action: its ops that no other op of that action consumes.
            ends = names - set().union(*[ancestors[op.name] for op in prev])
            assert ends
            for op in action_ops(ops, after):
                assert ends <= ancestors[op.name], (before, after, op.name, ends - ancestors[op.name])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_after_an_action_that_sends_the_stage_goes_on_only_through_a_release_on_the_host(trained, schedule):
    """The release is what lets a send go out before the stage's next action (see chain.pipeline.play)."""
    run, ops, ancestors = step_graph(trained(schedule, 2, "crossentropy"))
    devices = [s.device for s in run.stages]
    by_name = {op.name: op for op in ops}
    sending = [a for row in run.schedule.actions for a in row if play.sends(a, devices)]
    assert len(sending) == 2 * (K - 1) * 2  # every forward but the last stage's, every backward but the first's
    releases = sorted(n for n in by_name if n.startswith("release_") and "/" not in n)
    assert releases == sorted(play.release_name(a) for a in sending)
    for row in run.schedule.actions:
        for before, after in zip(row, row[1:] + (None,)):
            if before not in sending:
                continue
            release = by_name[play.release_name(before)]
            assert canonical(release.device) == "/device:CPU:0"  # the host
            assert {op.name for op in action_ops(ops, before)} <= ancestors[release.name]
            # The next action (after the last one: the update, constants and captures aside) waits for it.
            nxt = (
                action_ops(ops, after)
                if after
                else [
                    op
                    for op in ops
                    if op.name.startswith(play.update_scope(before.stage) + "/")
                    and op.type not in ("Const", "Placeholder")
                ]
            )
            assert nxt and all(release.name in ancestors[op.name] for op in nxt), (before, after)


WORKERS = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(3)]


def release_rows(name: str, stages: int, devices: list[str], microbatches: int = 4) -> list[list[str]]:
    """Each device row of `name`'s schedule with its released actions marked `!` (`play.released`)."""
    schedule = schedules.build(name, stages, microbatches)
    order = schedules.simulate(schedule).order()
    out = play.released(order, schedule, devices)
    return [[f"{a.kind}{a.microbatch}{'!' if a in out else ''}" for a in row] for row in schedule.actions]


def test_on_workers_a_send_before_a_receiving_forward_needs_no_release():
    """Across processes a forward's receive stops the row's chain (its ops, weight reads aside, wait for it): the send
    before it goes out without a release. Before a backward (its first ops run without the gradient), a
    forward that receives nothing (the first stage's), or nothing (a row's last action): released."""
    assert release_rows("1f1b", 2, WORKERS[:2]) == [
        ["F0!", "F1!", "B0", "F2!", "B1", "F3!", "B2", "B3"],
        ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3!"],
    ]
    # GPipe's last stage runs its backwards back to back: each send is released; its forwards send nothing
    assert release_rows("gpipe", 2, WORKERS[:2])[1] == ["F0", "F1", "F2", "F3", "B0!", "B1!", "B2!", "B3!"]
    # a middle stage: a forward's send before the next receiving forward is not released, before a backward it is
    assert release_rows("1f1b", 3, WORKERS)[1] == ["F0", "F1!", "B0", "F2!", "B1", "F3!", "B2!", "B3!"]


def test_in_one_process_every_send_is_released():
    """A receive from a device of the same process may be ready at once and stop nothing: every action that
    sends keeps its release, as before the rule."""
    local = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)]
    for name, k in [("1f1b", 2), ("gpipe", 3), ("eager1f1b", 3)]:
        schedule = schedules.build(name, k, 4)
        order = schedules.simulate(schedule).order()
        assert play.released(order, schedule, local) == {a for a in order if play.sends(a, local)}


def test_at_one_microbatch_the_step_is_not_chained_and_updates_bit_for_bit_as_the_chained_one():
    """At M=1 the step leaves out the per-action control dependencies and releases (they bound
    nothing there: chain.pipeline.play), and trains exactly as the step that keeps them (patched in,
    as a benchmark does: scripts/ablations.py)."""
    runs = [chain.build(chain.compose(BASE)) for _ in range(2)]
    st = runs[1].strategy
    with mock.patch.object(play, "chained", lambda schedule, grad_accum: True):
        st.set_step(play.e2e_step(st.stages, st.schedule, st.loss_fn(), st.target))
    batches = [b for b, _ in zip(runs[0].batches(), range(3))]
    for run in runs:
        for x, ys in batches:
            run.step(x, ys)
    graphs = [run.trace(*batches[0]).graph.get_operations() for run in runs]
    done = [[op for op in ops if op.name.endswith("/done")] for ops in graphs]
    releases = [[op for op in ops if op.name.startswith("release_") and "/" not in op.name] for ops in graphs]
    assert len(releases[0]) == 0
    # an action's `done` there only tells the host's stall markers (trainer.stall_s) it ended: no action waits on it
    assert done[0] and all(c.name.startswith("progress_") for op in done[0] for c in op._control_outputs)
    assert len(done[1]) == 2 * K and len(releases[1]) == 2 * (K - 1)  # what the chained step has
    for a, b in zip(runs[0].stages, runs[1].stages):
        mine, chained = ([v.numpy() for v in s.model.variables + s.optimizer.variables] for s in (a, b))
        assert len(mine) == len(chained)
        for u, v in zip(mine, chained):
            np.testing.assert_array_equal(u, v)


def test_every_op_of_the_step_is_read_back_as_the_action_that_made_it(trained):
    """The step names its ops in the schedule's vocabulary (`Action.scope`), and the timeline reads
    them back with `Action.parse`: each action's ops, and the updates, are found, and no other op."""
    run, ops, _ = step_graph(trained("1f1b", 2, "crossentropy"))
    parsed = {op.name: schedules.Action.parse(op.name) for op in ops if op.type != "Placeholder"}
    for row in run.schedule.actions:
        for a in row:
            mine = {op.name for op in action_ops(ops, a)}
            assert mine and mine == {name for name, b in parsed.items() if b == a}, a
    played = {a for row in run.schedule.actions for a in row}
    assert {b for b in parsed.values() if b is not None} == played
    updates = {schedules.update_stage(op.name) for op in ops} - {None}
    assert updates == set(range(len(run.stages)))


def test_step_refuses_a_batch_the_microbatches_do_not_divide(trained):
    t = trained("gpipe", 4, "crossentropy")
    run, (x, ys) = t["run"], t["batch"]
    with pytest.raises(
        ValueError,
        match=r"a batch of 14 examples does not cut into pipeline.microbatches=4 "
        r"equal microbatches; pass x and y with a multiple of 4 examples",
    ):
        run.step(x[:14], {k: v[:14] for k, v in ys.items()})


def test_crossentropy_on_a_real_valued_target_is_refused_before_training():
    with pytest.raises(chain.ConfigError) as e:
        chain.build(chain.compose(BASE + ["stage.target=value"]))
    assert "loss=sparse_categorical_crossentropy needs class labels" in str(e.value) and "loss=mse" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("overrides", [["pipeline.microbatches=3"], ["pipeline.microbatches=32"]])
def test_microbatches_that_do_not_divide_the_batch_size_are_a_config_error(overrides):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(BASE + overrides)
    m = overrides[0].split("=")[1]
    assert f"pipeline.microbatches={m} does not divide data.batch_size=16" in str(e.value)
    assert "\n" not in str(e.value)


def test_fit_writes_the_pipeline_summary(tmp_path):
    run = chain.build(
        chain.compose(
            BASE + ["pipeline.schedule=1f1b", "pipeline.microbatches=4", "trainer.steps=3", "trainer.progress=false"]
        ),
        run_dir=str(tmp_path),
    )
    summary = run.fit()
    with open(os.path.join(tmp_path, "summary.json")) as f:
        assert json.load(f) == summary
    assert (summary["mode"], summary["schedule"], summary["microbatches"]) == ("e2e", "1f1b", 4)
    assert summary["bubble_fraction"] == pytest.approx((K - 1) / (4 + K - 1))
    assert np.isfinite(summary["loss_first"]) and np.isfinite(summary["loss_last"])
    assert summary["peak_memory_scope"] == "process"  # logical CPUs share one allocator
    for s, st in zip(run.stages, summary["stages"]):
        assert st["device"] == s.device and st["variable_devices"] == [s.device] and st["params"] == s.params
        assert "loss_last" not in st  # no stage has a loss of its own in mode=e2e
    # On CPU the figure is the process's: every logical device reports the same number.
    peaks = {st["peak_memory_bytes"] for st in summary["stages"]}
    assert len(peaks) == 1 and isinstance(peaks.pop(), int)
    # The estimate beside it (issue 21): per stage, and their sum for the process-wide peak; 1F1B holds
    # min(M, K-k) microbatches on stage k.
    estimates = [st["estimated_peak_bytes"] for st in summary["stages"]]
    assert all(isinstance(e, int) and e > 0 for e in estimates) and summary["estimated_peak_bytes"] == sum(estimates)
    assert [f.held for f in run.assignment.footprints] == [min(4, K - k) for k in range(K)]


def test_peak_memory_sees_a_large_tensor_on_a_stage_device():
    memory.reset(DEVICES)
    with tf.device(DEVICES[1]):
        big = tf.random.normal([1 << 20]) + 1.0  # 4 MiB, far above what the CPU allocator leaves uncounted
    assert memory.peak_bytes(DEVICES[1]) >= big.numpy().nbytes
    assert memory.scope(DEVICES[1]) == "process" and memory.scope("/device:GPU:0") == "device"
    assert memory.peak_bytes("/device:GPU:7") is None  # a device that cannot report


def test_a_bare_label_array_is_the_chains_target():
    run = chain.build(chain.compose(BASE + LOSSES["mse_value"][0] + ["pipeline.microbatches=2"]))
    x, ys = next(iter(run.batches()))
    h = x
    for s in run.stages:
        h = s.model(h)
    expected = float(np.mean((h.numpy()[:, 0] - ys["value"].numpy()) ** 2))
    assert run.step(x, ys["value"])["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("schedule", schedules.NAMES)  # every built-in schedule
def test_a_run_from_the_written_schedule_file_trains_bit_equal_to_the_built_in_schedule(
    trained, schedule, tmp_path, capsys
):
    from chain.__main__ import show_plan

    base = BASES.get(schedule, BASE)
    path = tmp_path / f"{schedule}.csv"
    show_plan(
        chain.prepare(
            base
            + [
                f"pipeline.schedule={schedule}",
                "pipeline.microbatches=2",
                "plan_only=true",
                f"pipeline.schedule_out={path}",
            ]
        )
    )
    assert f"schedule written to {path}" in capsys.readouterr().out
    t = trained(schedule, 2, "crossentropy")
    base = [o for o in base if not o.startswith("pipeline.virtual_stages")]  # a file's rows place the stages
    run = chain.build(
        chain.compose(base + ["pipeline.schedule=file", f"pipeline.schedule_file={path}", "pipeline.microbatches=2"])
    )
    assert run.schedule.name == "file" and run.schedule.actions == t["run"].schedule.actions
    if schedule in BASES:  # the planner's note names the setting the run has, and the schedule's placement
        rule = "stage k on device k mod 2" if schedule == "interleaved" else "stage k and stage 3-k on device k"
        assert f"pipeline.schedule=file: 4 stages on 2 devices, {rule}" in run.assignment.notes
    assert [s.device for s in run.stages] == [s.device for s in t["run"].stages]
    for s, initial in zip(run.stages, t["initial"]):  # the same start
        for layer, before in zip(s.model.layers, initial):
            assert all(np.array_equal(w, b) for w, b in zip(layer.get_weights(), before))
    it = iter(run.batches())
    losses = [run.step(*next(it))["loss"] for _ in range(STEPS)]
    assert losses == t["chain_losses"]  # bit for bit
    for s, ref in zip(run.stages, t["run"].stages):
        for w, r in zip(s.trainable_variables, ref.trainable_variables):
            assert np.array_equal(w.numpy(), r.numpy()), (s.index, w.name)


def matmuls_by_kind(ops) -> dict[str, int]:
    """How many live MatMul ops each kind of action (F, B, W) of a traced step runs."""
    alive = live_ops(ops[0].graph)
    kinds = [
        schedules.Action.parse(op.name).kind
        for op in ops
        if op.type == "MatMul" and op.name in alive and schedules.Action.parse(op.name) is not None
    ]
    return {kind: kinds.count(kind) for kind in "FBW"}


def assert_split_backward_runs_the_same_products(counts: dict[str, dict[str, int]]) -> None:
    """zb1's B and W together run exactly 1F1B's backward products, and both kinds run."""
    assert counts["zb1"]["W"] > 0 and counts["zb1"]["B"] > 0
    assert counts["zb1"]["F"] == counts["1f1b"]["F"]
    assert counts["zb1"]["B"] + counts["zb1"]["W"] == counts["1f1b"]["B"], counts


def test_zb1_splits_each_backward_without_running_any_matmul_twice(trained):
    """B computes what the previous stage waits for, W the weights' gradients from the gradients B
    left at each layer's output: together they run exactly 1F1B's backward matrix products (the
    extra work is each activation's derivative, elementwise, once more in W)."""
    counts = {}
    for schedule in ("1f1b", "zb1"):
        run, ops, _ = step_graph(trained(schedule, 2, "crossentropy"))
        counts[schedule] = matmuls_by_kind(ops)
    assert_split_backward_runs_the_same_products(counts)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_interleaved_stages_train_like_one_keras_model_on_one_device(trained, m):
    """4 stages on 2 devices, stage k on device k mod 2, in Megatron's interleaved 1F1B order."""
    t = trained("interleaved", m, "crossentropy")
    run = t["run"]
    assert [s.device for s in run.stages] == [DEVICES[0], DEVICES[1], DEVICES[0], DEVICES[1]]
    assert run.schedule.name == "interleaved" and run.schedule.devices == 2 and run.schedule.stage_rows == (0, 1, 0, 1)
    assert_trained_like_keras(t)
    if m == 2:  # each device runs its stages' actions in the schedule's one order for that device
        _, ops, ancestors = step_graph(t)
        for row in run.schedule.actions:
            for before, after in zip(row, row[1:]):
                prev = action_ops(ops, before)
                ends = {op.name for op in prev} - set().union(*[ancestors[op.name] for op in prev])
                assert ends and all(ends <= ancestors[op.name] for op in action_ops(ops, after)), (before, after)


@pytest.mark.parametrize("m", [4, 8])  # M = 2D and 4D
def test_zbv_trains_like_one_keras_model_on_one_device(trained, m):
    """4 stages on 2 devices in a V (stages 0 and 3 on the first device, 1 and 2 on the second), each
    backward split into B and W, in torch's ZB-V order."""
    t = trained("zbv", m, "crossentropy")
    run = t["run"]
    assert [s.device for s in run.stages] == [DEVICES[0], DEVICES[1], DEVICES[1], DEVICES[0]]
    assert run.schedule.name == "zbv" and run.schedule.devices == 2 and run.schedule.stage_rows == (0, 1, 1, 0)
    assert "pipeline.schedule=zbv: 4 stages on 2 devices, stage k and stage 3-k on device k" in run.assignment.notes
    assert_trained_like_keras(t)
    if m == 4:  # each device runs its two stages' actions (F, B and W) in the schedule's one order for that device:
        _, ops, ancestors = step_graph(t)  # every op of an action waits for the end of the device's previous one
        for row in run.schedule.actions:
            for before, after in zip(row, row[1:]):
                mine = [op for op in ops if op.name.startswith(after.scope() + "/") and op.type != "Placeholder"]
                assert mine and all(f"{before.scope()}/done" in ancestors[op.name] for op in mine), (before, after)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+stages=3"],
            "pipeline.schedule=zbv runs two stages on each device (stage k and stage 2D-1-k on device k), so "
            "the chain needs an even number of stages, not 3; use 2 or 4 stages, or another schedule",
        ),
        (
            ["pipeline.virtual_stages=2"],
            "pipeline.virtual_stages=2 is interleaved's setting; pipeline.schedule=zbv always "
            "runs two stages on each device: set pipeline.virtual_stages=1",
        ),
        (
            ["placement.devices=[/CPU:0,/CPU:1,/CPU:0,/CPU:1]"],
            "placement.devices[2]=/CPU:0: pipeline.schedule=zbv runs stage k and stage 3-k on device k, so stage 2 belongs "
            "on placement.devices[1]=/CPU:1",
        ),
        (
            ["placement.devices=[/CPU:0,/CPU:0,/CPU:0,/CPU:0]"],
            "placement.devices: pipeline.schedule=zbv needs 2 different devices for stages 0, 1",
        ),
        (
            ["pipeline.recompute=always"],
            "pipeline.recompute=always is not available with a split backward "
            "(pipeline.schedule=zbv runs B and W apart",
        ),
    ],
)
def test_zbv_settings_that_cannot_work_are_one_config_error(overrides, message):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(ZBV + ["pipeline.schedule=zbv", "pipeline.microbatches=4"] + overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["pipeline.microbatches=1"],
            "pipeline.microbatches=1 is not a multiple of the 2 devices of pipeline.schedule="
            "interleaved (4 stages / pipeline.virtual_stages=2); use pipeline.microbatches=2 (or a multiple)",
        ),
        (["data.batch_size=24", "pipeline.microbatches=3"], "use pipeline.microbatches=2 or 4"),
        (
            ["pipeline.virtual_stages=3", "pipeline.microbatches=2"],
            "pipeline.virtual_stages=3 does not divide the 4 stages",
        ),
        (
            ["pipeline.schedule=1f1b"],
            "pipeline.virtual_stages=2 puts several stages on each device, which only "
            "pipeline.schedule=interleaved runs (is 1f1b)",
        ),
        (
            ["pipeline.microbatches=2", "placement.devices=[/CPU:0,/CPU:1,/CPU:1,/CPU:0]"],
            "placement.devices[2]=/CPU:1: pipeline.schedule=interleaved runs stage k on device k mod 2",
        ),
    ],
)
def test_interleaved_settings_that_cannot_work_are_one_config_error(overrides, message):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(INTERLEAVED + ["pipeline.schedule=interleaved"] + overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def skip_model() -> keras.Model:
    """A functional model with a skip connection (Add) inside what becomes a stage: 6 -> 8 -> 8 -> 4."""
    keras.utils.set_random_seed(3)
    x = keras.Input((6,))
    a = keras.layers.Dense(8, activation="relu", name="a")(x)
    b = keras.layers.Dense(8, activation="tanh", name="b")(a)
    c = keras.layers.Dense(8, activation="relu", name="c")(keras.layers.Add(name="skip")([a, b]))
    return keras.Model(x, keras.layers.Dense(4, name="out")(c))


def test_zb1_on_a_cut_functional_model_splits_each_backward_without_running_any_matmul_twice():
    """A cut Keras model (functional stages, one with a skip connection): W starts from the gradients B
    left at each weighted layer's output, as on Sequential stages, and trains as 1F1B does."""
    from chain.steps.forward import layer_by_layer

    counts, weights = {}, {}
    for schedule in ("1f1b", "zb1"):
        run = chain.build(
            chain.compose(["+stages=2", *BASE[1:], f"pipeline.schedule={schedule}", "pipeline.microbatches=2"]),
            model=skip_model(),
        )
        assert all(not isinstance(s.model, keras.Sequential) and layer_by_layer(s) for s in run.stages)
        it = iter(run.batches())
        for _ in range(3):
            run.step(*next(it))
        weights[schedule] = [v.numpy() for s in run.stages for v in s.trainable_variables]
        x, ys = next(it)
        ops = run.trace(x, ys).graph.get_operations()
        counts[schedule] = matmuls_by_kind(ops)
    assert_split_backward_runs_the_same_products(counts)
    for a, b in zip(weights["zb1"], weights["1f1b"], strict=True):
        assert rel_diff(a, b) <= 1e-6
