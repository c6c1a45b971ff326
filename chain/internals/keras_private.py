"""Keras' private parts chain uses: a functional model's graph nodes (`_nodes_by_depth`) and its
own graph walk (`_run_through_graph`, `_standardize_inputs`, `keras.src.models.functional`; the order it calls
the nodes in), a
layer's tracked sublayers (`_layers`) and attributes (`_delete_tracking`) and every layer under a model (`_flatten_layers`),
BatchNormalization's batch moments (`_moments`, patched per layer), and an optimizer's variable
index and slot lists (`_get_variable_index`, `_trainable_variables`, Adam's `_momentums` and
`_velocities`), a tensor's implicit mask (`get_keras_mask`) and the TensorFlow variable inside a Keras
variable (`_value`). Keras has no public view of these. Keras is imported only inside the functions."""

from __future__ import annotations

from typing import Any, Callable


def graph_nodes(model: Any) -> list[Any]:
    """Every node of a functional model's graph (its input nodes included), deepest first: the
    order in which its own graph walk (`_run_through_graph`) calls them (`model._nodes_by_depth`)."""
    return [node for depth in sorted(model._nodes_by_depth, reverse=True) for node in model._nodes_by_depth[depth]]


def plain_functional(model: Any) -> bool:
    """Whether `model` is a functional model (`keras.src.models.functional.Functional`, which
    Keras does not export) that runs its graph with Functional's own `call` (a subclass with its
    own `call` may run something else)."""
    from keras.src.models.functional import Functional

    return isinstance(model, Functional) and type(model).call is Functional.call


def run_graph(model: Any, inputs: Any, wrap: Callable[[Any, Callable], Callable], training: bool = True) -> Any:
    """A plain functional model's output on `inputs`, as its `call` computes it (its private graph
    walk, `_run_through_graph` over `_standardize_inputs`, with Keras' per-node call
    `functional.operation_fn`), each node's call passed through `wrap(operation, call)` first: what
    runs for that node (e.g. the call, recording its inputs and output)."""
    from keras.src.models import functional

    def operation_fn(op):
        return wrap(op, functional.operation_fn(op, training=training))

    out = model._run_through_graph(model._standardize_inputs(inputs), operation_fn=operation_fn)
    return functional.unpack_singleton(out)


def run_nodes(model: Any, inputs: Any, wrap: Callable[[Any, Callable], Callable], training: bool = False) -> Any:
    """`run_graph`, each call passed through `wrap(node, call)`: the graph node it runs (its arguments,
    its output tensors), not only its operation. Keras' graph walk calls the nodes in `graph_nodes`'
    order (input nodes aside); a walk in another order raises RuntimeError."""
    nodes = iter([node for node in graph_nodes(model) if not node.is_input])

    def by_node(op: Any, call: Callable) -> Callable:
        node = next(nodes, None)
        if node is None or node.operation is not op:
            raise RuntimeError(f"Keras' graph walk of {model.name!r} called {op.name!r} out of its nodes' order")
        return wrap(node, call)

    return run_graph(model, inputs, by_node, training=training)


def untrack_sublayer(layer: Any, sub: Any) -> None:
    """Stop `layer` tracking `sub` as one of its sublayers (remove it from `layer._layers`), so
    that `sub`'s weights are no longer `layer`'s: a sublayer the layer made and chain replaces."""
    for n, tracked in enumerate(layer._layers):
        if tracked is sub:
            del layer._layers[n]
            break


def untrack_attribute(layer: Any, name: str) -> None:
    """Stop TensorFlow's checkpoints following `layer`'s attribute `name` (`_delete_tracking` of its
    `AutoTrackable` base): what the attribute holds is saved by its owner, not through `layer`."""
    layer._delete_tracking(name)


def all_layers(model: Any) -> list[Any]:
    """`model` and every layer under it, nested models' layers included (`_flatten_layers()`,
    which `model.layers` is not: it lists the top level only)."""
    return list(model._flatten_layers())


def own_moments(layer: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
    """BatchNormalization's own `(mean, variance)` of a batch, `fn(inputs, mask)`, for `layer`
    (the class's private `_moments`, the hook its `call` asks for the batch's statistics)."""
    own = type(layer)._moments
    return lambda inputs, mask: own(layer, inputs, mask)


def patch_moments(layer: Any, moments: Callable[[Any, Any], tuple[Any, Any]]) -> None:
    """Make `layer`'s `call` take its batch's statistics from `moments(inputs, mask)` (an instance
    attribute over the class's private `_moments`; `unpatch_moments` removes it)."""
    object.__setattr__(layer, "_moments", moments)


def unpatch_moments(layer: Any) -> None:
    """Undo `patch_moments`: `layer` computes its batch's statistics as its class does."""
    object.__delattr__(layer, "_moments")


def variable_index(optimizer: Any, variable: Any) -> int:
    """The index of `variable` among those `optimizer` was built for (`_get_variable_index`): the
    index of its slots in the optimizer's slot lists."""
    return optimizer._get_variable_index(variable)


def adam_slots(optimizer: Any, index: int) -> tuple[Any, Any]:
    """Adam's first and second moment (`_momentums[index]`, `_velocities[index]`) of the variable
    at `index` (`variable_index`)."""
    return optimizer._momentums[index], optimizer._velocities[index]


def built_for(optimizer: Any) -> list[Any]:
    """The variables `optimizer` was built for, in its slot lists' order (`_trainable_variables`)."""
    return optimizer._trainable_variables


def slot_lists(optimizer: Any) -> dict[str, list[Any]]:
    """`optimizer`'s slot variables by slot kind (its attribute's name, e.g. Adam's `_momentums` and
    `_velocities`), each list aligned with `built_for(optimizer)`: Keras 3 keeps them as private
    lists parallel to `_trainable_variables`, found here by that shape (none for an optimizer built
    for no variables)."""
    import keras

    n = len(built_for(optimizer))
    return {
        name: value
        for name, value in vars(optimizer).items()
        if name not in ("_trainable_variables", "_variables")
        and isinstance(value, list)
        and n
        and len(value) == n
        and all(isinstance(v, keras.Variable) for v in value)
    }


def keras_mask(tensor: Any) -> Any:
    """The implicit mask Keras attached to `tensor` (`Embedding(mask_zero=True)` and the layers after
    it: `keras.src.backend.get_keras_mask`, the `_keras_mask` attribute), or None."""
    from keras.src.backend import get_keras_mask

    return get_keras_mask(tensor)


def move_variables(layer: Any) -> None:
    """Re-create every variable of `layer` under the caller's device scope, with its value: the
    TensorFlow variable inside each Keras variable (`_value`) is replaced, so the layer object (and
    every model holding it) now reads and updates the new one. For a layer chain reuses as it is
    because its config does not re-create it."""
    import tensorflow as tf

    for v in layer.weights:
        old = v.value
        v._value = tf.Variable(old.read_value(), trainable=old.trainable, name=old.name.split(":")[0])
