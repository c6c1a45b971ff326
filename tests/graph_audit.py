"""Reading a compiled training step's graph: where each op is placed, what crosses devices.

An op's requested device is its `device` attribute. Reads of resource variables carry
none on purpose (TensorFlow places them with the variable), so their device is the
captured variable's device. Function arguments and outputs have no device: they are
the boundary with the caller.

Control flow (`If`, e.g. the numerics guard's `tf.cond` around each optimizer update)
keeps its branches in separate function graphs; the audit walks into them, giving each
branch argument the device of the outer tensor it receives, so an update inside a
branch is audited like any other op.

Function calls (`trainer.jit_compile=true`: each stage's compiled forward, its gradient
and its update) are audited as one op each: the call's device is where the whole
function runs (XLA compiles it for that one device), its inputs (captured variables
included) must come from that device or through a copy, and `body_devices` lists any
device an op inside asks for, so a test can check that nothing inside points elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chain.steps.ops import COPY_PREFIX
from chain.planning.devices import canonical

# Ops whose placement TensorFlow derives from their resource input.
RESOURCE_OPS = {
    "ReadVariableOp",
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
    "ResourceGather",
    "VarIsInitializedOp",
}
CONTROL_FLOW = {"If", "StatelessIf"}
CALLS = {"PartitionedCall", "StatefulPartitionedCall"}


@dataclass
class Audit:
    graph: object
    device: dict = field(default_factory=dict)  # op -> canonical device or None
    args: set = field(default_factory=set)  # argument placeholders (of the step and of branches)
    outputs: set = field(default_factory=set)  # ops that return values to a caller
    local: dict = field(default_factory=dict)  # op -> name without enclosing control-flow prefixes
    _ops: list = field(default_factory=list)

    def ops(self):
        return list(self._ops)

    def name(self, op) -> str:
        """The op's name as its code named it (`optim_00/...`, not `cond/optim_00/...`)."""
        return self.local[op]

    def crossings(self):
        """(consumer op, producer op) pairs whose devices differ (both placed)."""
        out = []
        for op in self._ops:
            for t in op.inputs:
                a, b = self.device.get(t.op), self.device[op]
                if a is not None and b is not None and a != b:
                    out.append((op, t.op))
        return out

    def misplaced(self, devices) -> list:
        """Ops placed outside `devices`, and unplaced ops other than the caller boundary."""
        bad = []
        for op in self._ops:
            d = self.device[op]
            boundary = op in self.args | self.outputs or op.type == "NoOp"
            if (d is None and not boundary) or (d is not None and d not in devices):
                bad.append((op.name, d))
        return bad

    def copies(self):
        return [op for op in self._ops if op.name.split("/")[-1].startswith(COPY_PREFIX)]

    def report_copies(self):
        """The copies of each stage's report (its losses and guard flag, a few scalars) to the
        last stage's device, where the step's one report vector is assembled."""
        return [op for op in self.copies() if op.name.split("/")[-1].startswith(COPY_PREFIX + "report_")]


def _branches(graph, op):
    # The branch functions are registered on the graph that holds the `If` op.
    for attr in ("then_branch", "else_branch"):
        yield graph._get_function(op.get_attr(attr).name).graph


def _walk(a: Audit, graph, given: dict, prefix: str) -> None:
    for op in graph.get_operations():  # topological order: inputs first
        a._ops.append(op)
        a.local[op] = op.name[len(prefix) :] if prefix and op.name.startswith(prefix) else op.name
        if op.device:
            a.device[op] = canonical(op.device)
        elif op in given:
            a.device[op] = given[op]
        elif op.type in RESOURCE_OPS and op.inputs:
            a.device[op] = a.device.get(op.inputs[0].op)
        else:
            a.device[op] = None
        if op.type in CONTROL_FLOW:
            outer = list(op.inputs)[1:]  # input 0 is the predicate
            for branch in _branches(graph, op):
                inner = {ph.op: a.device.get(t.op) for ph, t in zip(branch.inputs, outer)}
                a.args |= {ph.op for ph in branch.inputs if inner.get(ph.op) is None}
                a.outputs |= {t.op for t in branch.outputs}
                _walk(a, branch, inner, op.name + "/")


def audit(concrete_fn) -> Audit:
    g = concrete_fn.graph
    captured = {
        internal.op: canonical(external.device) for external, internal in g.captures if getattr(external, "device", "")
    }
    a = Audit(g)
    a.args = {t.op for t in g.inputs if t.op not in captured}
    a.outputs = {t.op for t in g.outputs}
    _walk(a, g, captured, "")
    return a


def _function(graph, name: str):
    """The function `name` as registered on `graph` or on a graph enclosing it."""
    while graph is not None:
        fn = graph._get_function(name)
        if fn is not None:
            return fn
        graph = getattr(graph, "outer_graph", None)
    raise KeyError(name)


def compiled_calls(a: Audit) -> list:
    """Calls of functions that XLA must compile (`tf.function(jit_compile=True)` and their gradients)."""
    return [
        op
        for op in a.ops()
        if op.type in CALLS and "_XlaMustCompile" in op.node_def.attr and op.get_attr("_XlaMustCompile")
    ]


def body_devices(call) -> set:
    """Canonical devices requested by any op inside the function `call` runs (nested calls and branches too)."""
    out, seen = set(), set()
    stack = [_function(call.graph, call.get_attr("f").name).graph]
    while stack:
        graph = stack.pop()
        for op in graph.get_operations():
            if op.device:
                out.add(canonical(op.device))
            names = []
            if op.type in CALLS:
                names.append(op.get_attr("f").name)
            if op.type in CONTROL_FLOW:
                names += [op.get_attr(attr).name for attr in ("then_branch", "else_branch")]
            for name in names:
                if name not in seen:
                    seen.add(name)
                    stack.append(_function(graph, name).graph)
    return out


def ancestors(op) -> set:
    """Names of every op that `op` waits for, through data or control edges."""
    out, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in out:
                out.add(parent.name)
                stack.append(parent)
    return out


def live_ops(graph) -> set[str]:
    """The ops a call of the compiled step runs: what its results and stateful ops need (a function
    prunes the rest, such as the weight products a tape builds for a B that only wants dL/dinput)."""
    stack = [t.op for t in graph.outputs] + list(graph.control_outputs)
    stack += [op for op in graph.get_operations() if op.type.startswith(("Assign", "ReadVariable", "Resource"))]
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen.add(op.name)
            stack += [i.op for i in op.inputs] + list(op.control_inputs)
    return seen
