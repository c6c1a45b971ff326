"""TensorFlow's private parts chain uses: the eager context's host address space
(`tensorflow.python.eager.context`), adding a control edge to an op of a graph being built
(`Operation._add_control_input`), a dataset's serialized graph (`Dataset._as_serialized_graph`),
a trace file's `XSpace` (`tensorflow.tsl.profiler.protobuf.xplane_pb2`), a checkpoint's object graph
(`tensorflow.core.protobuf.trackable_object_graph_pb2`) and the requests of its
profiler service (`tensorflow.ProfilerService`, whose request messages TensorFlow does not ship
in Python: encoded here). TensorFlow is imported only inside the functions, so the TensorFlow-free
modules that use one of them (the timeline's trace reader) import it only when they call it."""

from __future__ import annotations

from typing import Any

PROFILE = "/tensorflow.ProfilerService/Profile"  # the profiler service's gRPC methods
TERMINATE = "/tensorflow.ProfilerService/Terminate"
ACTIVE = "Another profiling session active"  # the service's refusal while a session runs


def host_address_space() -> str:
    """This process's host address space (`/job:localhost/replica:0/task:0`; in a cluster, the
    client's), from the eager context (`tensorflow.python.eager.context`): `tf.config` names
    devices without their job and task."""
    from tensorflow.python.eager import context

    return context.context().host_address_space()


def add_control_input(op: Any, before: Any) -> None:
    """Make `op` wait for `before` (`Operation._add_control_input`): a control edge added to an op
    already made, while its graph is still being built; `tf.control_dependencies` adds edges only
    to ops made inside it."""
    op._add_control_input(before)  # noqa: SLF001


def serialize_dataset(dataset: Any) -> Any:
    """`dataset`'s graph serialized as a checkpoint of its iterator serializes it first, refusing
    external state (`Dataset._as_serialized_graph` with `ExternalStatePolicy.FAIL`): raises what a
    checkpoint of it would (`tf.errors.OpError` or `ValueError`) when its state cannot be saved."""
    import tensorflow as tf

    return dataset._as_serialized_graph(external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)


def read_xspace(path: str) -> Any:
    """The `XSpace` of a profiler's trace file (`*.xplane.pb`), parsed with TensorFlow's message
    class (`tensorflow.tsl.profiler.protobuf.xplane_pb2`, not in its public API)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def checkpoint_children(prefix: str, name: str) -> list[str]:
    """The names of the objects under the root's child `name` in the checkpoint `prefix` (its object
    graph, a `TrackableObjectGraph` message: the names a restore matches by); [] when the root has no
    such child."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    node = next((c.node_id for c in graph.nodes[0].children if c.local_name == name), None)
    return [] if node is None else [c.local_name for c in graph.nodes[node].children]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), bytes or a string length-delimited (2)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def profile_request(session: str, root: str, host: str, duration_ms: int, emit: bool = False) -> bytes:
    """A `ProfileRequest` of TensorFlow's profiler service (`tsl/profiler/protobuf/profiler_service.proto`:
    {1 duration_ms, 4 opts (a `ProfileOptions`, which TensorFlow ships, from `tensorflow.tsl`),
    5 repository_root, 6 session_id, 7 host_name, 9 emit_xspace}): trace for up to `duration_ms` (or
    until `Terminate(session)`) with the options `tf.profiler.experimental.client.trace` uses by
    default, then write the trace to `root/session/host.xplane.pb` (`emit`: return it in the answer
    instead)."""
    from tensorflow.tsl.profiler.protobuf import profiler_options_pb2

    options = profiler_options_pb2.ProfileOptions(
        version=1, host_tracer_level=2, device_tracer_level=1, python_tracer_level=0, duration_ms=duration_ms
    )
    return (
        _field(1, duration_ms)
        + _field(4, options.SerializeToString())
        + _field(5, root)
        + _field(6, session)
        + _field(7, host)
        + (_field(9, 1) if emit else b"")
    )


def terminate_request(session: str) -> bytes:
    """A `TerminateRequest` of TensorFlow's profiler service ({1 session_id}) for `session`."""
    return _field(1, session)
