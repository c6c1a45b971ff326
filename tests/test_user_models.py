"""Your models: stages from your builders (config `_target_` and Python API), and one Keras model
cut into stages (by `placement.split` and `placement.balance`) computing exactly what it did."""

from __future__ import annotations

import os
import re

import keras
import numpy as np
import pytest

import chain
import chain.data
import user_nets
from chain.stages.bodies import from_builder
from compare import trains_like_one_device
from conftest import DEVICES, read_summary, run_cli, run_dirs
from graph_audit import audit

HERE = os.path.dirname(os.path.abspath(__file__))
SYNTH = [
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
BUILDERS = "+stages=[{model: {_target_: user_nets.encoder, units: 12}},{model: {_target_: user_nets.head}}]"


def cli_with_nets(tmp_path, *overrides):
    return run_cli(tmp_path, *overrides, env={"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])})


# --- stages from builders --------------------------------------------------------------------


def test_builders_from_the_command_line_train_on_their_devices(tmp_path):
    r = cli_with_nets(tmp_path, BUILDERS, "mode=e2e", "trainer.steps=60", "optim.lr=0.01", *SYNTH)
    assert r.returncode == 0, r.stderr
    assert "user_nets.encoder(units=12)" in r.stdout and "user_nets.head()" in r.stdout
    s = read_summary(run_dirs(tmp_path)[0])
    assert [st["variable_devices"] for st in s["stages"]] == [[DEVICES[0]], [DEVICES[1]]]
    assert s["stages"][0]["params"] == 6 * 12 + 12 and s["loss_last"] < s["loss_first"]
    assert s["val"]["accuracy"] > 0.5  # it learned (4 classes)


def test_one_builder_for_every_stage_with_its_arguments(tmp_path):
    r = cli_with_nets(
        tmp_path, "+stages=3", "model._target_=user_nets.block", "model.units=5", "trainer.steps=3", *SYNTH
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("user_nets.block(units=5)") == 3


def test_builders_through_the_python_api_place_every_variable_and_op_on_their_device():
    run = chain.build(
        chain.compose(["mode=e2e", "pipeline.microbatches=2", *SYNTH]),
        stages=[lambda input_shape: user_nets.encoder(input_shape, units=10), user_nets.head],
    )
    assert [s.variable_devices() for s in run.stages] == [[DEVICES[0]], [DEVICES[1]]]
    x, ys = next(iter(run.batches()))
    a = audit(run.trace(x, ys))
    assert a.misplaced({s.device for s in run.stages}) == []
    assert all(c.name.split("/")[-1].startswith("copy_to_") for c, _ in a.crossings())
    assert np.isfinite(run.step(x, ys)["loss"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+stages=[{model: {_target_: user_nets.missing}},{}]"],
            "stages[0].model._target_=user_nets.missing: cannot import it",
        ),
        (["+stages=[{model: {_target_: no_such_pkg.nets.x}},{}]"], "cannot import it"),
        (
            ["+stages=[{model: {_target_: user_nets.broken}},{}]"],
            "stages[0].model._target_=user_nets.broken raised RuntimeError: the builder failed on purpose",
        ),
        (
            ["+stages=[{model: {_target_: user_nets.not_a_layer}},{}]"],
            "returned str; a builder returns a keras.Layer, a keras.Model or a list of layers",
        ),
        (["+stages=[{model: {_target_: user_nets.conv_only}},{}]"], "cannot take input of shape (6,)"),
        (
            ["mode=e2e", "+stages=[{},{model: {_target_: user_nets.encoder}}]"],
            "outputs shape (16,), but the last stage of a mode=e2e chain must output the prediction of target 'label'",
        ),
    ],
)
def test_bad_builders_are_one_line_and_leave_nothing(tmp_path, overrides, message):
    r = cli_with_nets(tmp_path, *overrides, "trainer.steps=2", *SYNTH)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_target_that_cannot_be_imported_or_raises_reads_alike_for_models_and_data():
    """A target that cannot be imported reads alike for a model builder and a data function (Python's
    reason, found when the config is checked); a target that raises when called shows its own error's
    first line."""
    why = "(ModuleNotFoundError: No module named 'no_such_pkg')"
    cases = {"no_such_pkg.nets.x": f"cannot import it {why}", "user_nets.broken": None, "user_datasets.broken": None}
    for target in cases:
        model = f"stages[0].model._target_={target}"
        with pytest.raises(chain.ConfigError) as e:
            from_builder(target, None, model)((6,), "float32", "s0")
        said = {"model": str(e.value)}
        with pytest.raises(chain.ConfigError) as e:
            chain.data.load(chain.compose(["data=callable", f"data._target_={target}"]).data, 0)
        said["data"] = str(e.value)
        if target == "no_such_pkg.nets.x":
            assert said == {"model": f"{model}: {cases[target]}", "data": f"data._target_={target}: {cases[target]}"}
        elif target == "user_nets.broken":
            assert said["model"] == f"{model} raised RuntimeError: the builder failed on purpose"
        else:
            assert said["data"] == f"data._target_={target} raised RuntimeError: the function failed on purpose"


def test_a_target_of_the_wrong_kind_is_refused_before_it_is_called(tmp_path):
    """`optim._target_` naming a function (here one that writes a file): one line naming the key, exit 2,
    the function never called and no run directory."""
    ran = tmp_path / "ran"
    r = cli_with_nets(
        tmp_path, "optim._target_=user_nets.writes_a_file", f"+optim.file={ran}", "trainer.steps=2", *SYNTH
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and lines == [
        "error: optim._target_=user_nets.writes_a_file is a function, not a Keras optimizer class (a subclass of "
        "keras.optimizers.Optimizer): name one, e.g. keras.optimizers.RMSprop"
    ], r.stderr
    assert not ran.exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["optim._target_=keras.layers.Dense"],
            "optim._target_=keras.layers.Dense is the class Dense, not a Keras "
            "optimizer class (a subclass of keras.optimizers.Optimizer)",
        ),
        (
            ["+stages=[{optim: {_target_: collections.OrderedDict}},{}]"],
            "stages[0].optim._target_=collections.OrderedDict is the class OrderedDict, not a Keras optimizer class",
        ),
        (
            ["optim._target_=keras.optimizers.Adam.no_such"],
            "optim._target_=keras.optimizers.Adam.no_such: cannot import it (keras.optimizers.Adam has no 'no_such')",
        ),
        (
            ["model._target_=user_nets.keras"],
            "stages[0].model._target_=user_nets.keras is a module, not a function: name "
            "a function that returns a keras.Layer, a keras.Model or a list of layers",
        ),
        (
            ["+stages=[{},{model: {_target_: user_nets.missing}}]"],
            "stages[1].model._target_=user_nets.missing: cannot import it (user_nets has no 'missing')",
        ),
        (
            ["data=callable", "data._target_=user_datasets.np"],
            "data._target_=user_datasets.np is a module, not a function: "
            "name a function that returns a tf.data.Dataset of (x, y)",
        ),
    ],
)
def test_every_kind_of_target_is_checked_when_the_config_is(overrides, message):
    """Each `_target_` is resolved and its kind checked by `chain.compose` (the preparation pass), before a
    build could call it."""
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# --- one model cut into stages ---------------------------------------------------------------


def sequential(widths=(8, 8, 8, 8, 8, 8, 8, 8, 8)) -> keras.Model:
    keras.utils.set_random_seed(3)
    layers = [keras.layers.Dense(w, activation="tanh") for w in widths] + [keras.layers.Dense(4)]
    return keras.Sequential([keras.Input((6,)), *layers], name="seq")


def functional_with_a_skip() -> keras.Model:
    """A chain of layers with one skip connection, inside layers 2-4."""
    keras.utils.set_random_seed(4)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="d0")(x)
    h = keras.layers.Dense(8, activation="tanh", name="d1")(h)
    a = keras.layers.Dense(8, activation="tanh", name="d2")(h)
    b = keras.layers.Dense(8, name="d3")(a)
    h = keras.layers.Add(name="add")([a, b])
    h = keras.layers.Dense(8, activation="tanh", name="d5")(h)
    return keras.Model(x, keras.layers.Dense(4, name="out")(h), name="skipper")


def chain_predictions(run, x) -> np.ndarray:
    return run.forward(x)[f"body_{len(run.stages) - 1}"].numpy()


@pytest.mark.parametrize(
    "how, sizes",
    [
        (["placement.split=[4,3,3]"], [4, 3, 3]),
        (["placement.balance=params"], None),
        (["placement.balance=even"], [4, 3, 3]),
    ],
)
def test_a_sequential_cut_into_stages_predicts_exactly_like_the_model(how, sizes):
    model = sequential()
    run = chain.build(chain.compose(["+stages=3", "mode=e2e", *SYNTH, *how]), model=model)
    assert sum(len(s.model.layers) for s in run.stages) == 10 + 3  # each stage's model has its input layer
    if sizes:
        assert [len(s.model.layers) - 1 for s in run.stages] == sizes
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, x), model.predict(x, verbose=0), rtol=0, atol=1e-6)
    for s in run.stages:
        assert s.variable_devices() == [s.device]


def test_balance_by_params_evens_the_parameter_counts():
    model = sequential(widths=(64, 8, 8, 8, 8, 8, 8, 8, 8))  # the first two layers hold most parameters
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *SYNTH, "placement.balance=params"]), model=model)
    params = [s.params for s in run.stages]
    assert len(run.stages[0].model.layers) - 1 == 2 and max(params) / min(params) < 2
    assert any("placement.balance=params: split [2, 8]" in n for n in run.notes)


def test_a_functional_model_with_a_skip_inside_a_stage_is_cut_exactly():
    model = functional_with_a_skip()
    run = chain.build(chain.compose(["+stages=3", "mode=e2e", *SYNTH, "placement.split=[2,3,2]"]), model=model)
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, x), model.predict(x, verbose=0), rtol=0, atol=1e-6)


def test_a_skip_connection_across_a_cut_crosses_with_the_other_tensor():
    """placement.split=[4,1,2] cuts before 'add', which takes d2's output across the cut: both tensors
    cross (it was refused when one tensor crossed a cut)."""
    model = functional_with_a_skip()
    run = chain.build(
        chain.compose(
            [
                "+stages=3",
                "mode=e2e",
                *SYNTH,
                "placement.split=[4,1,2]",
                "pipeline.microbatches=2",
                "optim=sgd",
                "optim.lr=0.1",
            ]
        ),
        model=model,
    )
    assert len(run.stages[1].model.inputs) == 2  # d2's and d3's outputs
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, x), model.predict(x, verbose=0), rtol=0, atol=1e-6)
    trains_like_one_device(run, functional_with_a_skip(), DEVICES[3], steps=3)


def test_even_and_balanced_splits_avoid_the_cuts_a_skip_forbids():
    """7 layers on 4 stages: the even split [2, 2, 2, 1] would cut before 'add'; the chosen
    split is as even as the skip allows."""
    run = chain.build(chain.compose(["+stages=4", "mode=e2e", *SYNTH]), model=functional_with_a_skip())
    sizes = [len(s.model.layers) - 1 for s in run.stages]
    assert sum(sizes) == 7 and max(sizes) == 2 and 4 not in [sum(sizes[:k]) for k in range(1, 4)]


def test_a_model_with_two_inputs_is_cut_and_one_with_two_outputs_refused():
    a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(4, name="d0")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], keras.layers.Dense(4, name="d1")(h))
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *SYNTH]), model=model)
    assert len(run.stages[0].model.inputs) == 2
    two = keras.Model([a, b], [h, keras.layers.Dense(4)(h)])
    with pytest.raises(chain.ConfigError, match=r"has 2 outputs; a model cut into a chain of stages has one"):
        chain.build(chain.compose(["mode=e2e", *SYNTH]), model=two)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["placement.split=[4,3,4]"], "placement.split=[4, 3, 4] adds up to 11 layers, but seq has 10"),
        (["placement.split=[4,3]"], "placement.split has 2 entries, but there are 3 stages"),
        (["placement.split=[4,0,6]"], "placement.split[1]=0 must be >= 1"),
    ],
)
def test_bad_splits_are_one_line(overrides, message):
    with pytest.raises(chain.ConfigError) as e:
        chain.build(chain.compose(["+stages=3", "mode=e2e", *SYNTH, *overrides]), model=sequential())
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_cut_model_trains_like_the_same_model_on_one_device():
    """mode=e2e, 1F1B over 4 microbatches, SGD: 5 steps of the cut model equal 5 steps of
    the Keras model itself on one device (tolerance 1e-5, as for the chain's own stages)."""
    model = sequential()
    reference = sequential()
    run = chain.build(
        chain.compose(
            [
                "+stages=3",
                "mode=e2e",
                "pipeline.schedule=1f1b",
                "pipeline.microbatches=4",
                "optim=sgd",
                "optim.lr=0.1",
                *SYNTH,
            ]
        ),
        model=model,
    )
    trains_like_one_device(run, reference, DEVICES[3], steps=5)


def test_a_keras_file_from_the_command_line(tmp_path):
    path = str(tmp_path / "net.keras")
    sequential().save(path)
    r = run_cli(
        tmp_path,
        "+stages=2",
        "mode=e2e",
        "model=keras",
        f"model.path={path}",
        "placement.split=[6,4]",
        "trainer.steps=10",
        *SYNTH,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"0 .*net.keras layers 0-5", r.stdout) and re.search(r"1 .*net.keras layers 6-9", r.stdout)
    s = read_summary(run_dirs(tmp_path)[0])
    assert s["loss_last"] < s["loss_first"]


def test_a_missing_keras_file_needs_no_tensorflow_to_refuse(tmp_path):
    r = run_cli(tmp_path, "model=keras", "model.path=nowhere.keras", "trainer.steps=2")
    assert r.returncode == 2 and r.stderr.strip() == "error: model.path='nowhere.keras': no such file"


def test_split_without_a_model_to_cut_is_refused():
    with pytest.raises(chain.ConfigError, match=r"^placement.split cuts one model into stages: it needs model=keras"):
        chain.build(chain.compose(["placement.split=[1,1]", *SYNTH]))


def test_balance_by_time_moves_the_cut_away_from_a_heavy_layer():
    """Two layers (256->2048, 2048->256) each do 8x the work of the 256->256 layers around
    them, both in the even split's first stage (about 19 units against 3: a margin that another
    process's load on the shared machine does not cover): balance=time, from times measured per
    layer, moves the cut and predicts a shorter step than the even split's."""
    keras.utils.set_random_seed(5)
    widths = [256] * 3 + [2048] + [256] * 4
    layers = [keras.layers.Dense(w, activation="tanh") for w in widths] + [keras.layers.Dense(4)]
    model = keras.Sequential([keras.Input((256,)), *layers])
    data = [
        "data=synthetic",
        "data.features=256",
        "data.classes=4",
        "data.samples=512",
        "data.batch_size=256",
        "trainer.progress=false",
        "checkpoint.export=false",
    ]
    run = chain.build(
        chain.compose(["+stages=2", "mode=e2e", "pipeline.microbatches=4", "placement.balance=time", *data]),
        model=model,
    )
    (note,) = [n for n in run.notes if n.startswith("placement.balance=time")]
    m = re.fullmatch(
        r"placement.balance=time: split \[(\d+), (\d+)\]: .*predicted step ([\d.]+) ms; "
        r"the even split \[5, 4\]: .*predicted step ([\d.]+) ms",
        note,
    )
    assert m, note
    sizes, predicted, even = [int(m.group(1)), int(m.group(2))], float(m.group(3)), float(m.group(4))
    assert sizes != [5, 4] and predicted < even


# --- checkpoints, resume, exports, restage with user models -----------------------------------


def builder_run(run_dir, steps, *extra):
    cfg = chain.compose(
        [
            "mode=e2e",
            "pipeline.microbatches=2",
            "model.dropout=0.0",
            f"trainer.steps={steps}",
            "checkpoint.every=2",
            *SYNTH,
            *extra,
        ]
    )
    return chain.build(cfg, run_dir=str(run_dir), stages=[user_nets.block, user_nets.head])


def test_user_models_checkpoint_resume_bit_exact_and_export(tmp_path):
    from compare import weights

    straight = builder_run(tmp_path / "straight", 4, "checkpoint.export=true")
    straight.fit()
    builder_run(tmp_path / "resumed", 2).fit()
    resumed = builder_run(tmp_path / "resumed", 4, "resume=true")
    assert resumed.fit()["resumed_from"] == 2
    for a, b in zip(weights(straight), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    x, _ = next(iter(straight.batches()))
    loaded = keras.models.load_model(str(tmp_path / "straight" / "chain.keras"))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), chain_predictions(straight, x), rtol=0, atol=1e-6)


def test_restage_refuses_a_chain_of_user_models(tmp_path):
    src = str(tmp_path / "src")
    r = cli_with_nets(tmp_path, BUILDERS, "mode=e2e", "trainer.steps=2", f"hydra.run.dir={src}", *SYNTH)
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, src, str(tmp_path / "dst"), "+stages=1", module="chain.restage", env={"PYTHONPATH": HERE})
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: SRC stage 0 is user_nets.encoder(units=12), a user model: restage regroups the layers of the chain's "
        "own mlp/conv stages and cannot re-cut it; for a cut Keras model, start a new run with another placement.split"
    )
