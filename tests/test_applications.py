"""keras.applications models (weights=None, 32x32x3, no downloads), which nobody here wrote, cut
into 2, 3 and 4 stages by `even`, `params` and `time`: every cut is a single-tensor cut (checked
against the model's own config), the stages predict what the model predicts, and e2e training
equals a one-device tape loop on the same batches (MobileNetV2, in a fresh process with Grappler
off: see tests/applications_e2e.py). Slow: a file of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from chain.planning import balance
from chain.stages import cut
from chain.stages.timing import LinkTimes, link_times
from conftest import DEVICES, EXTENDED

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["ResNet50", "MobileNetV2", "DenseNet121", "EfficientNetB0"]
HOWS = ["even", "params", "time"]


def make(name: str) -> keras.Model:
    keras.utils.set_random_seed(7)
    return getattr(keras.applications, name)(
        weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None
    )


def config_edges(model: keras.Model) -> list[tuple[str, tuple]]:
    """(consumer layer, producer tensor (layer, node, index)) for every tensor a layer takes,
    read from the model's config (what `model.save` writes), not from chain's graph walk."""
    edges = []

    def walk(consumer, value):
        if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
            edges.append((consumer, tuple(value["config"]["keras_history"])))
        elif isinstance(value, dict):
            for v in value.values():
                walk(consumer, v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(consumer, v)

    for entry in model.get_config()["layers"]:
        walk(entry["name"], entry.get("inbound_nodes", []))
    return edges


def crossing(model: keras.Model, c: cut.Cuttable, at: int, edges) -> set[tuple]:
    """The tensors made before layer `at` (or the input) and taken from layer `at` on."""
    before = {layer.name for layer in c.layers[:at]} | {
        layer.name for layer in model.layers if isinstance(layer, keras.layers.InputLayer)
    }
    after = {layer.name for layer in c.layers[at:]}
    return {t for consumer, t in edges if consumer in after and t[0] in before}


TIMED = "MobileNetV2"  # its pieces are timed; the others get uneven made-up times (timing all four: ~60 s)


def made_up_times(c: cut.Cuttable, seed: int) -> LinkTimes:
    """Uneven piece times (seeded): the time split's balance works on any costs, and what it must
    keep (cuts where one tensor crosses) does not depend on where they came from."""
    points = c.points()
    rng = np.random.default_rng(seed)
    times = rng.uniform(1e-4, 1e-2, len(points) - 1).tolist()
    return LinkTimes(list(zip(points, points[1:])), {d: times for d in DEVICES}, ["CPU:0"], [1] * len(times))


@pytest.fixture(scope="module")
def analysed():
    """Each model, its analysis, and its pieces' times: measured on one CPU (a microbatch of 4) for
    `TIMED`, made up for the others."""
    out = {}
    for j, name in enumerate(NAMES):
        model = make(name)
        c = cut.analyse(model, name)
        measured = (
            link_times(c, DEVICES, {d: "CPU:0" for d in DEVICES}, 4, progress=False)
            if name == TIMED
            else made_up_times(c, j)
        )
        out[name] = (model, c, measured)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_split_of_an_application_cuts_where_one_tensor_crosses(analysed, name):
    model, c, measured = analysed[name]
    edges = config_edges(model)
    assert len(c.layers) == len([layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)])
    for k in (2, 3, 4):
        for how in HOWS:
            costs = [measured.layer_costs(d) for d in DEVICES[:k]] if how == "time" else None
            sizes = cut.split(c, k, None, how, costs)
            assert len(sizes) == k and min(sizes) >= 1 and sum(sizes) == len(c.layers), (k, how, sizes)
            for at in balance.sizes_to_cuts(sizes):
                assert len(crossing(model, c, at, edges)) == 1, (k, how, sizes, at)
    # and the analysis refuses exactly the cuts more than one tensor crosses
    for at in range(1, len(c.layers)):
        assert (at in c.allowed) == (len(crossing(model, c, at, edges)) == 1), at


def chained_predictions(c: cut.Cuttable, sizes, x) -> np.ndarray:
    shape, y = (32, 32, 3), x
    for k, body in enumerate(cut.pieces(c, sizes)):
        with tf.device(DEVICES[k]):
            stage = body(shape, None, f"stage_{k}")
        shape, y = tuple(stage.output_shape[1:]), stage(y, training=False)
    return y.numpy()


# EXTENDED: the suite's time; DenseNet121's cuts are checked every time (above) and its stages are built as the
# other three's, which predict every time
@pytest.mark.parametrize("name", [pytest.param(n, marks=EXTENDED if n == "DenseNet121" else ()) for n in NAMES])
def test_an_application_cut_into_stages_predicts_what_it_predicts(analysed, name):
    model, c, measured = analysed[name]
    x = tf.random.stateless_normal((4, 32, 32, 3), seed=(1, 2))
    want = model(x, training=False).numpy()
    # every split kind on the timed model; one split (the most stages) on the others, whose pieces are built
    # the same way (about 25 s less of building stages)
    splits = [(2, "time"), (3, "even"), (4, "params")] if name == TIMED else [(4, "params")]
    for k, how in splits:
        costs = [measured.layer_costs(d) for d in DEVICES[:k]] if how == "time" else None
        got = chained_predictions(c, cut.split(c, k, None, how, costs), x)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {k} stages by {how}")


@EXTENDED  # for the suite's time: every split of each application runs every time (above)
def test_mobilenet_cut_into_three_stages_by_time_trains_like_the_model_on_one_device(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "images.npz", x=rng.normal(size=(48, 32, 32, 3)).astype("float32"), y=rng.integers(0, 10, 48))
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "applications_e2e.py"),
            "MobileNetV2",
            "3",
            "time",
            str(tmp_path / "images.npz"),
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(result["sizes"]) == 3 and result["variables"] > 100
    assert [a for a, _ in result["losses"]] == [b for _, b in result["losses"]], result["losses"]
    assert result["unequal"] == [] and result["unequal_statistics"] == []
    assert result["moved"] > 0.9 * result["variables"]  # trained, not left at the start
