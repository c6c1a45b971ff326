"""Every wrapper of chain.internals against the installed TensorFlow, Keras and Hydra: a new version
that moves or changes one of their private parts fails here, naming the wrapper."""

from __future__ import annotations

import socket

import keras
import numpy as np
import pytest
import tensorflow as tf

from chain.internals import hydra_private, keras_private, tf_private


def _functional() -> tuple[keras.Model, keras.layers.Layer, keras.layers.Layer]:
    keras.utils.set_random_seed(0)
    a, b = keras.layers.Dense(3, name="a"), keras.layers.Dense(2, name="b")
    inp = keras.Input((4,))
    return keras.Model(inp, b(a(inp))), a, b


# TensorFlow


def test_host_address_space_is_this_processs_job_and_task():
    assert tf_private.host_address_space() == "/job:localhost/replica:0/task:0"


def test_add_control_input_makes_an_op_wait_for_another():
    with tf.Graph().as_default():
        first, second = tf.constant(1.0, name="first"), tf.constant(2.0, name="second")
        assert first.op not in second.op.control_inputs
        tf_private.add_control_input(second.op, first.op)
        assert second.op.control_inputs == [first.op]


def test_checkpoint_children_are_the_names_under_a_child_of_the_root(tmp_path):
    v, w = tf.Variable(1.0), tf.Variable(2.0)
    prefix = tf.train.Checkpoint(model=v, keyed={"w0": v, "w1": w}).save(str(tmp_path / "ckpt"))
    assert sorted(tf_private.checkpoint_children(prefix, "keyed")) == ["w0", "w1"]
    assert tf_private.checkpoint_children(prefix, "absent") == []


def test_serialize_dataset_refuses_what_a_checkpoint_cannot_save():
    saveable = tf.data.Dataset.from_tensor_slices(np.arange(4.0)).map(lambda x: x * 2)
    assert tf_private.serialize_dataset(saveable).dtype == tf.string
    generated = tf.data.Dataset.from_generator(lambda: iter([1.0]), output_signature=tf.TensorSpec((), tf.float32))
    with pytest.raises((tf.errors.OpError, ValueError)):
        tf_private.serialize_dataset(generated)


def test_the_profiler_service_traces_a_session_from_its_requests_until_terminated(tmp_path):
    """`profile_request`, `terminate_request`, `ACTIVE` and `read_xspace` against this process's own
    profiler server, through the client chain's cluster runs use (`WorkerTraces`)."""
    from chain.training.worker_trace import WorkerTraces

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    tf.profiler.experimental.server.start(port)
    traces = WorkerTraces([f"localhost:{port}"], ["here"])
    try:
        traces.check()  # idle: the probe (an emitted trace) answered
        traces.start("internals", str(tmp_path))  # returns once the session refuses a probe with ACTIVE
        tf.reduce_sum(tf.ones((8, 8)))
        assert traces.stop() == []
    finally:
        traces.close()
    [path] = tmp_path.rglob("*.xplane.pb")
    space = tf_private.read_xspace(str(path))
    assert type(space).__name__ == "XSpace" and len(space.planes) > 0
    assert tf_private.terminate_request("s") == b"\n\x01s"  # field 1, length-delimited, 1 byte


# Keras


def test_graph_nodes_are_the_functional_models_nodes_deepest_first():
    model, a, b = _functional()
    nodes = keras_private.graph_nodes(model)
    assert nodes[0].is_input and [n.operation for n in nodes[1:]] == [a, b]


def test_plain_functional_tells_a_graph_run_by_keras_from_a_subclass_with_its_own_call():
    model, _, _ = _functional()

    class Own(type(model)):
        def call(self, inputs):
            return super().call(inputs)

    inp = keras.Input((4,))
    assert keras_private.plain_functional(model)
    assert not keras_private.plain_functional(Own(inp, keras.layers.Dense(1)(inp)))
    assert not keras_private.plain_functional(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))


def test_run_graph_and_run_nodes_run_the_model_as_its_call_does_each_node_through_the_wrapper():
    model, a, b = _functional()
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)), tf.float32)
    seen = []

    def wrap(op, call):
        seen.append(op)
        return call

    out = keras_private.run_graph(model, x, wrap, training=True)
    assert seen == [a, b]
    np.testing.assert_array_equal(out.numpy(), model(x, training=True).numpy())
    nodes = []  # run_nodes: the same walk, each node given
    out = keras_private.run_nodes(model, x, lambda node, call: nodes.append(node) or call)
    assert [n.operation for n in nodes] == [a, b] and nodes[1].input_tensors == nodes[0].outputs
    np.testing.assert_array_equal(out.numpy(), model(x, training=False).numpy())


def test_keras_mask_is_what_keras_attaches_when_it_runs_a_layer():
    ids = tf.constant([[1, 2, 0]])
    embedded = keras.layers.Embedding(3, 2, mask_zero=True)(ids)
    np.testing.assert_array_equal(keras_private.keras_mask(embedded), [[True, True, False]])
    assert keras_private.keras_mask(ids) is None


def test_untrack_sublayer_drops_a_sublayers_weights_from_its_parent():
    class Outer(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(2)

        def call(self, x):
            return self.inner(x)

    outer = Outer()
    outer(tf.ones((1, 3)))
    assert len(outer.weights) == 2
    keras_private.untrack_sublayer(outer, outer.inner)
    assert outer.weights == [] and outer.inner.built


def test_all_layers_reaches_into_nested_models():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="deep")], name="inner")
    outer = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1, name="top")], name="outer")
    names = [layer.name for layer in keras_private.all_layers(outer)]
    assert {"outer", "inner", "deep", "top"} <= set(names) and "deep" not in [la.name for la in outer.layers]


def test_batch_norm_moments_can_be_recorded_and_restored():
    layer = keras.layers.BatchNormalization()
    x = tf.constant(np.random.default_rng(1).normal(size=(6, 3)), tf.float32)
    layer(x, training=False)  # built
    own, calls = keras_private.own_moments(layer), []

    def recorded(inputs, mask):
        calls.append(own(inputs, mask))
        return calls[-1]

    keras_private.patch_moments(layer, recorded)
    patched = layer(x, training=True)
    keras_private.unpatch_moments(layer)
    plain = layer(x, training=True)
    assert len(calls) == 1 and "_moments" not in vars(layer)
    np.testing.assert_allclose(calls[0][0].numpy(), x.numpy().mean(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(patched.numpy(), plain.numpy())


def test_an_optimizers_variable_index_and_slots():
    v = [keras.Variable(np.zeros((2,), np.float32)), keras.Variable(np.zeros((3,), np.float32))]
    adam = keras.optimizers.Adam()
    adam.build(v)
    assert [id(x) for x in keras_private.built_for(adam)] == [id(x) for x in v]
    assert keras_private.variable_index(adam, v[1]) == 1
    m, velocity = keras_private.adam_slots(adam, 1)
    assert tuple(m.shape) == tuple(velocity.shape) == (3,) and m is not velocity
    assert set(keras_private.slot_lists(adam)) == {"_momentums", "_velocities"}
    assert keras_private.slot_lists(adam)["_momentums"][1] is m
    sgd = keras.optimizers.SGD(momentum=0.9)
    sgd.build(v)
    assert set(keras_private.slot_lists(sgd)) == {"momentums"}


# Hydra


def test_hydras_argument_parser_reads_one_group_of_overrides():
    parsed, unread = hydra_private.args_parser().parse_known_args(["a=1", "--multirun", "b=2"])
    assert parsed.overrides == ["a=1"] and parsed.multirun and unread == ["b=2"]


def test_hydras_basic_sweeper_splits_a_sweep_into_jobs():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(["x=1,2", "y=3"])
    assert hydra_private.split_sweep(parsed) == [[["x=1", "y=3"], ["x=2", "y=3"]]]
