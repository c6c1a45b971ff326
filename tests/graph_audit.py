"""Reading a compiled training step's graph: where each op is placed, what crosses devices.

An op's requested device is its `device` attribute. Reads of resource variables carry
none on purpose (TensorFlow places them with the variable), so their device is the
captured variable's device. Function arguments and outputs have no device: they are
the boundary with the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.engine import COPY_PREFIX
from chain.planner import canonical

# Ops whose placement TensorFlow derives from their resource input.
RESOURCE_OPS = {"ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                "ResourceGather", "VarIsInitializedOp"}


@dataclass
class Audit:
    graph: object
    device: dict  # op name -> canonical device or None
    args: set  # names of argument placeholders
    outputs: set  # names of ops that return values to the caller

    def ops(self):
        return self.graph.get_operations()

    def crossings(self):
        """(consumer op, producer op) pairs whose devices differ (both placed)."""
        out = []
        for op in self.ops():
            for t in op.inputs:
                a, b = self.device[t.op.name], self.device[op.name]
                if a is not None and b is not None and a != b:
                    out.append((op, t.op))
        return out

    def copies(self):
        return [op for op in self.ops() if op.name.split("/")[-1].startswith(COPY_PREFIX)]


def audit(concrete_fn) -> Audit:
    g = concrete_fn.graph
    captured = {internal.op.name: canonical(external.device) for external, internal in g.captures
                if getattr(external, "device", "")}
    device = {}
    for op in g.get_operations():  # topological order: inputs first
        if op.device:
            device[op.name] = canonical(op.device)
        elif op.name in captured:
            device[op.name] = captured[op.name]
        elif op.type in RESOURCE_OPS and op.inputs:
            device[op.name] = device.get(op.inputs[0].op.name)
        else:
            device[op.name] = None
    args = {t.op.name for t in g.inputs if t.op.name not in captured}
    outputs = {t.op.name for t in g.outputs}
    return Audit(g, device, args, outputs)
