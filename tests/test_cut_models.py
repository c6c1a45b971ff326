"""One Keras model cut into stages, for models nobody here wrote: branches and skips timed by
`placement.balance=time`, a Transformer block (a layer taking two tensors inside a stage), an
input of any image size, layers Keras cannot rebuild from their config, and the balance note."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import chain
from compare import trains_like_one_device
from conftest import DEVICES, EXTENDED, read_summary, run_cli, run_dirs

L = keras.layers
SYNTH = [
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
DIGITS = ["data=digits", "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false"]


def skip_model() -> keras.Model:
    """The issue's reproduction: a skip from the first Dense to an Add."""
    keras.utils.set_random_seed(11)
    x = keras.Input((6,))
    a = L.Dense(8, name="a")(x)
    b = L.Dense(8, name="b")(a)
    return keras.Model(x, L.Dense(4, name="out")(L.Add(name="add")([a, b])), name="skip")


def encoder_block(seq=5, width=8, classes=4) -> keras.Model:
    """A Transformer encoder block: self-attention (MultiHeadAttention()(x, x)) + residual +
    LayerNormalization, a feed-forward part + residual + LayerNormalization, a read-out."""
    keras.utils.set_random_seed(12)
    x = keras.Input((seq, width))
    h = L.Dense(width, name="embed")(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(h, h)
    h = L.LayerNormalization(name="ln1")(L.Add(name="res1")([h, a]))
    f = L.Dense(width, name="ff2")(L.Dense(16, activation="relu", name="ff1")(h))
    h = L.LayerNormalization(name="ln2")(L.Add(name="res2")([h, f]))
    h = L.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(x, L.Dense(classes, name="logits")(h), name="encoder")


def functional_with_a_skip() -> keras.Model:
    """7 layers, a skip from 'd2' (layer 2) to 'add' (layer 4): no cut before 'd3' or 'add'."""
    keras.utils.set_random_seed(4)
    x = keras.Input((6,))
    h = L.Dense(8, activation="tanh", name="d0")(x)
    h = L.Dense(8, activation="tanh", name="d1")(h)
    a = L.Dense(8, activation="tanh", name="d2")(h)
    h = L.Add(name="add")([a, L.Dense(8, name="d3")(a)])
    h = L.Dense(8, activation="tanh", name="d5")(h)
    return keras.Model(x, L.Dense(4, name="out")(h), name="skipper")


def chain_predictions(run, x) -> np.ndarray:
    return run.forward(x)[f"body_{len(run.stages) - 1}"].numpy()


def stage_layers(run) -> list[list[str]]:
    return [[layer.name for layer in s.model.layers if not isinstance(layer, L.InputLayer)] for s in run.stages]


# --- item 2: balance=time on a model with a branch or a skip -------------------------------


def test_balance_by_time_on_a_model_with_a_skip_from_the_command_line(tmp_path):
    """The issue's reproduction: it used to exit 1 with a KeyError from the profiler."""
    path = str(tmp_path / "skip.keras")
    skip_model().save(path)
    r = run_cli(
        tmp_path,
        "model=keras",
        f"model.path={path}",
        "+stages=2",
        "mode=e2e",
        "placement.balance=time",
        "data=synthetic",
        "data.features=6",
        "data.classes=4",
        "trainer.steps=2",
        "trainer.progress=false",
    )
    assert r.returncode == 0, r.stderr
    # one tensor crosses after 'a' ([1, 3]: 'b' and 'add' both take it) or after 'add' ([3, 1]);
    # after 'b' ([2, 2]) 'a' and 'b' would both cross. Which of the two is faster is the timing's call.
    found = re.search(r"placement.balance=time: split \[(\d+), (\d+)\]", r.stdout + r.stderr)
    assert found and [int(n) for n in found.groups()] in ([1, 3], [3, 1]), r.stdout
    assert len(run_dirs(tmp_path)) == 1 and read_summary(run_dirs(tmp_path)[0])["steps"] == 2


def test_time_is_measured_once_per_physical_device_per_piece_between_cuts():
    """The four logical CPU devices share one CPU: one measurement serves all four; the pieces
    timed are those between the cuts the model allows (not single layers)."""
    from chain.stages import cut
    from chain.stages.timing import link_times

    c = cut.analyse(encoder_block(), "encoder")
    measured = link_times(c, DEVICES, {d: "CPU:0" for d in DEVICES}, batch=4, progress=False)
    assert measured.links == [
        (0, 1),
        (1, 3),
        (3, 4),
        (4, 7),
        (7, 8),
        (8, 9),
        (9, 10),
    ]  # embed | mha res1 | ln1 | ff1 ff2 res2 | ...
    assert measured.measured == ["CPU:0"]
    assert all(measured.times[d] is measured.times[DEVICES[0]] for d in DEVICES)
    assert all(t > 0 for t in measured.times[DEVICES[0]])
    assert 1 <= max(measured.calls) <= 40  # stopped once the median settled, within the cap


def test_mode_local_refuses_a_split_two_tensors_cross_in_one_line_and_writes_nothing(tmp_path):
    """Issue 48: mode=local's head reads its stage's output, one tensor; a split where the skip's two
    tensors cross was a ValueError and a 39-line traceback (exit 1), the run directory left behind."""
    path = str(tmp_path / "skip.keras")
    skip_model().save(path)
    r = run_cli(
        tmp_path,
        "model=keras",
        f"model.path={path}",
        "placement.split=[2,2]",
        "trainer.steps=2",
        *SYNTH,
        "hydra.run.dir=out",
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        f"error: mode=local: placement.split=[2, 2] cuts {path} before layer 2 ('add'), "
        "where layer 'add' (layer 2) takes the output of 'a' (layer 0) across it"
    ), r.stderr
    assert (
        "set mode=e2e, or a placement.split whose cuts one tensor crosses: before layers 1 ('b'), 3 ('out')" in r.stderr
    )
    assert not os.path.exists(tmp_path / "out")


def test_mode_local_balances_only_where_one_tensor_crosses():
    """The data read again by the read-out crosses every cut but the last: mode=e2e cuts anywhere,
    mode=local only there, and refuses what needs another cut in one line."""
    from chain.stages import cut

    x = keras.Input((6,))
    h = L.Dense(8, name="d2")(L.Dense(8, name="d1")(x))
    c = cut.analyse(keras.Model(x, L.Dense(4, name="out")(L.Concatenate(name="cat")([h, x]))), "wide")
    assert c.allowed == [3] and cut.split(c, 3, None, "params", None) == [1, 1, 2]
    assert cut.split(c, 2, None, "even", None, "mode=local") == [3, 1]
    with pytest.raises(
        chain.ConfigError,
        match=r"^mode=local: wide cannot be cut into 3 stages that each hold weights "
        r"where one tensor crosses each cut \(cuts one tensor crosses: before layers 3 \('out'\)\)",
    ):
        cut.split(c, 3, None, "params", None, "mode=local")


# --- item 3: a layer taking two tensors inside a stage (Transformer blocks) ------------------


def test_a_transformer_block_cuts_only_where_one_tensor_crosses():
    from chain.stages import cut

    c = cut.analyse(encoder_block(), "encoder")
    assert [layer.name for layer in c.layers] == [
        "embed",
        "mha",
        "res1",
        "ln1",
        "ff1",
        "ff2",
        "res2",
        "ln2",
        "pool",
        "logits",
    ]
    # not before res1 (h and mha's output cross), ff2 or res2 (ln1's and ff1's or ff2's outputs cross)
    assert c.allowed == [1, 3, 4, 7, 8, 9]
    assert c.blocked[2] == "layer 'res1' (layer 2) takes the output of 'embed' (layer 0) across it"


@pytest.mark.parametrize(
    "stages, how",
    [
        (2, "placement.balance=even"),
        # the suite's time: the block cut into 2 and 4 stages runs every time, balance=params in the other tests here
        pytest.param(3, "placement.balance=params", marks=EXTENDED),
        (4, "placement.balance=even"),
    ],
)
def test_a_transformer_block_cut_into_stages_predicts_and_trains_like_the_model(tmp_path, stages, how):
    x = np.random.default_rng(0).normal(size=(64, 5, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 4, 64)
    np.savez(tmp_path / "seq.npz", x=x, y=y)
    model = encoder_block()
    data = [
        "data=npz",
        f"data.path={tmp_path / 'seq.npz'}",
        "data.y=y",
        "data.batch_size=16",
        "data.shuffle=false",
        "trainer.progress=false",
        "checkpoint.export=false",
    ]
    run = chain.build(
        chain.compose([f"+stages={stages}", "mode=e2e", "optim=sgd", "optim.lr=0.1", how, *data]), model=model
    )
    assert len(run.stages) == stages and "mha" in sum(stage_layers(run), [])
    np.testing.assert_allclose(chain_predictions(run, x[:16]), model.predict(x[:16], verbose=0), rtol=0, atol=1e-6)
    trains_like_one_device(run, encoder_block(), DEVICES[3])


# --- item 4: an input of any image size ------------------------------------------------------


def any_size_cnn() -> keras.Model:
    keras.utils.set_random_seed(13)
    x = keras.Input((None, None, 1))
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="c1")(x)
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="c2")(h)
    h = L.GlobalAveragePooling2D(name="pool")(h)
    return keras.Model(x, L.Dense(10, name="logits")(h), name="anysize")


def test_a_model_taking_any_image_size_is_cut_for_the_data_it_gets():
    model = any_size_cnn()
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *DIGITS]), model=model)
    assert tuple(run.stages[0].model.input_shape[1:]) == (8, 8, 1)
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, x), model.predict(x, verbose=0), rtol=0, atol=1e-6)


def test_a_model_whose_input_does_not_fit_the_data_is_refused_in_one_line():
    x = keras.Input((None, None, 3))
    model = keras.Model(x, L.Dense(10)(L.GlobalAveragePooling2D()(L.Conv2D(4, 3)(x))), name="rgb")
    with pytest.raises(chain.ConfigError) as e:
        chain.build(chain.compose(["+stages=2", "mode=e2e", *DIGITS]), model=model)
    assert str(e.value) == (
        "rgb takes input of shape (None, None, 3) (None: any size), but data=digits examples have shape (8, 8, 1)"
    )


# --- item 5: layers Keras cannot rebuild from their config -----------------------------------


class Scale(L.Layer):
    """A custom layer nobody registered with Keras."""

    def __init__(self, factor: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def with_lambda_and_custom() -> keras.Model:
    keras.utils.set_random_seed(14)
    x = keras.Input((6,))
    h = L.Dense(8, name="d1")(x)
    h = L.Lambda(lambda t: t * 0.5, name="half")(h)
    h = Scale(3.0, name="scale")(L.Dense(8, name="d2")(h))
    return keras.Model(x, L.Dense(4, name="out")(h), name="lam")


def test_a_model_with_a_lambda_and_an_unregistered_layer_is_cut_exactly():
    model = with_lambda_and_custom()
    run = chain.build(chain.compose(["+stages=3", "mode=e2e", *SYNTH, "placement.split=[2,2,1]"]), model=model)
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, x), model.predict(x, verbose=0), rtol=0, atol=1e-6)


class Factor:
    def __init__(self, value: float):
        self.value = value


class NoConfig(L.Layer):
    """A custom layer taking an object Keras cannot serialize, without get_config: it cannot be re-created."""

    def __init__(self, factor: Factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor.value


def test_a_layer_that_cannot_be_recreated_is_reused_on_its_stage_device():
    """It used to be refused (`cannot be re-created ... from its config`): it trains on one device, so its
    stage reuses the layer object, its variables (here none) re-created on the stage's device."""
    keras.utils.set_random_seed(7)
    x = keras.Input((6,))
    model = keras.Model(x, L.Dense(4)(NoConfig(Factor(2.0), name="noconf")(L.Dense(8)(x))), name="nc")
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *SYNTH]), model=model)
    assert any(layer is model.get_layer("noconf") for s in run.stages for layer in s.model.layers)
    xb, _ = next(iter(run.batches()))
    np.testing.assert_allclose(chain_predictions(run, xb), model.predict(xb, verbose=0), rtol=0, atol=1e-6)


def test_a_keras_file_with_a_lambda_is_one_line_naming_the_option_and_runs_with_it(tmp_path):
    path = str(tmp_path / "lam.keras")
    x = keras.Input((6,))
    keras.Model(x, L.Dense(4)(L.Lambda(lambda t: t * 0.5, name="half")(L.Dense(8)(x)))).save(path)
    common = ["model=keras", f"model.path={path}", "+stages=2", "mode=e2e", "trainer.steps=2", *SYNTH]
    r = run_cli(tmp_path, *common)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: model.path={path!r} holds Python code (a Lambda layer) that Keras runs only when told to: "
        "if you trust the file, set model.safe_mode=false"
    ), r.stderr
    assert not (tmp_path / "outputs").exists()
    r = run_cli(tmp_path, *common, "model.safe_mode=false")
    assert r.returncode == 0, r.stderr


def test_a_keras_file_with_an_unregistered_layer_is_one_line_naming_the_fix(tmp_path):
    path = str(tmp_path / "scale.keras")
    x = keras.Input((6,))
    keras.Model(x, L.Dense(4)(Scale(name="scale")(L.Dense(8)(x)))).save(path)
    r = run_cli(tmp_path, "model=keras", f"model.path={path}", "+stages=2", "mode=e2e", "trainer.steps=2", *SYNTH)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: model.path={path!r} uses a layer class Keras does not know ('Scale'): register it with "
        "@keras.saving.register_keras_serializable() in a module and name that module in model.imports=[...]"
    ), r.stderr
    assert not (tmp_path / "outputs").exists()


def test_model_imports_registers_a_custom_layer_before_loading(tmp_path):
    (tmp_path / "my_layers.py").write_text(
        "import keras\n\n"
        "@keras.saving.register_keras_serializable(package='mine')\n"
        "class Scale(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return x * 2.0\n"
    )
    path = str(tmp_path / "scale.keras")
    make = (
        "import keras, my_layers; L = keras.layers; x = keras.Input((6,)); "
        f"keras.Model(x, L.Dense(4)(my_layers.Scale()(L.Dense(8)(x)))).save({path!r})"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    subprocess.run([sys.executable, "-c", make], cwd=tmp_path, check=True, env=dict(os.environ, **env))
    common = ["model=keras", f"model.path={path}", "+stages=2", "mode=e2e", "trainer.steps=2", *SYNTH]
    r = run_cli(tmp_path, *common, "model.imports=[my_layers]", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, *common, "model.imports=[no_such_module_here]", env=env)
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "error: model.imports: cannot import 'no_such_module_here' (ModuleNotFoundError"
    ), r.stderr


# --- item 6: the balance note compares with the split `even` gives ---------------------------


def test_the_balance_note_compares_with_the_split_even_really_gives():
    even = chain.build(chain.compose(["+stages=4", "mode=e2e", *SYNTH]), model=functional_with_a_skip())
    sizes = [len(s.model.layers) - 1 for s in even.stages]
    run = chain.build(
        chain.compose(["+stages=4", "mode=e2e", *SYNTH, "placement.balance=params"]), model=functional_with_a_skip()
    )
    (note,) = [n for n in run.notes if n.startswith("placement.balance=params")]
    assert f"the even split {sizes}:" in note, note
    assert sizes != [2, 2, 2, 1]  # the plain even split cuts across the skip


# --- issue 21 item 4: placement.balance=memory on a cut model with an uneven layer list ------


def uneven_layers() -> keras.Model:
    """A wide first layer and a parameter-free activation, then narrow layers: parameter counts and
    activation memory disagree about where to cut."""
    keras.utils.set_random_seed(3)
    x = keras.Input((6,))
    h = L.ReLU(name="r1")(L.Dense(64, name="wide")(x))
    for i in range(4):
        h = L.Dense(8, name=f"d{i}")(h)
    return keras.Model(x, L.Dense(4, name="out")(h), name="uneven")


def test_balance_by_memory_makes_the_largest_estimated_peak_smallest():
    cfg = [
        "+stages=3",
        "mode=e2e",
        "pipeline.schedule=1f1b",
        "pipeline.microbatches=4",
        *SYNTH,
        "data.samples=512",
        "data.batch_size=128",
    ]
    peaks = {}
    for how in ("even", "params", "memory"):
        run = chain.build(chain.compose([*cfg, f"placement.balance={how}"]), model=uneven_layers())
        peaks[how] = ([len(s.model.layers) - 1 for s in run.stages], max(f.total for f in run.assignment.footprints))
    (note,) = [n for n in run.notes if n.startswith("placement.balance=memory")]
    assert f"split {peaks['memory'][0]}: estimated peaks" in note and "the even split [3, 2, 2]" in note, note
    # the first layer alone is stage 0's floor, which params reaches too; memory once put the weightless
    # 'r1' on a stage of its own ([1, 1, 5]), which no balance chooses now: it ties with params' split
    assert peaks["memory"][0] == [1, 2, 4], peaks
    assert peaks["memory"][1] < peaks["even"][1] and peaks["memory"][1] <= peaks["params"][1], peaks
