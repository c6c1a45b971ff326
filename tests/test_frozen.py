"""An assignment that does not change after planning (issue 40, item 3): `Assignment` and `RunSpec` are
frozen dataclasses whose sequences are tuples; a build makes new records for what it adds (the
checked devices, the notes of `devices.configure`, of a cut model and of the strategy) and leaves the
`RunSpec` it was given as it was; and no module assigns to, or mutates a field of, an assignment or a
spec (an AST scan)."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

import chain
from chain.planning.inventory import Inventory
from chain.planning.planner import Assignment, assign
from chain.prepared import RunSpec

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "model.depth=1",
    "model.width=8",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
CONFIGS = {
    "e2e": ["+stages=3", "mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
    "mirrored": ["+stages=2", "mode=e2e", "placement.fallback=mirrored", "pipeline.microbatches=2"],
    "replicated": ["+stages=2", "mode=e2e", "placement.replicas=2", "pipeline.microbatches=2"],
}


def test_placement_and_run_spec_are_frozen_with_tuples():
    p = assign(chain.compose(["+stages=3", "placement.fallback=mirrored"]).placement, 3, Inventory())
    spec = RunSpec(chain.compose(["+stages=3"]), None, p, Inventory())
    for record, field in ((p, "devices"), (p, "notes"), (spec, "assignment")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)
    assert not any(isinstance(getattr(p, f.name), list) for f in dataclasses.fields(Assignment))
    assert p.mirrored_devices == ("/device:CPU:0", "/device:CPU:1") and p.copies == ()
    later = p.noted("a later note")  # what is added later is a new record
    assert later.notes == (*p.notes, "a later note") and "a later note" not in p.notes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_build_leaves_the_run_spec_it_was_given_unchanged(name):
    spec = chain.prepared.prepare(chain.compose([*SMALL, *CONFIGS[name]]))
    before = copy.deepcopy(spec)
    run = chain.build(spec)
    assert spec == before and spec.assignment == before.assignment
    # the build's additions are on its own record: the configure note (the test session's CPUs were split first)
    assert run.assignment is not spec.assignment and len(run.assignment.notes) > len(spec.assignment.notes)
    assert run.strategy.batch_cut is spec.batch_cut  # the batch's cut, worked out once, read as it is
    if name == "mirrored":
        assert any(n.startswith("pipeline.microbatches=2 ignored") for n in run.assignment.notes)
        assert not any(n.startswith("pipeline.microbatches=2 ignored") for n in spec.assignment.notes)
    if name == "replicated":
        assert len(run.assignment.copies) == 2 and run.assignment.copies == spec.assignment.copies


# --- structure: nothing assigns to an assignment or a spec --------------------------------------------

RECORDS = {"assignment", "spec", "run_spec"}  # names an Assignment or a RunSpec goes by
MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
    "update",
    "setdefault",
    "popitem",
    "__setitem__",
    "__delitem__",
}


def mutations(source: str, names: set[str] = RECORDS) -> list[int]:
    """Lines of `source` that assign to a record's field, mutate one in place, or set one behind the
    dataclass's back (`object.__setattr__`, `setattr`); `names`: what a record goes by."""

    def _is_record(node: ast.AST) -> bool:  # `assignment`, `self.assignment`, `spec.assignment`, ...
        return (isinstance(node, ast.Name) and node.id in names) or (
            isinstance(node, ast.Attribute) and node.attr in names
        )

    def _field_of_record(node: ast.AST) -> bool:  # `assignment.notes`, `spec.assignment.devices`, `assignment.split[0]`
        while isinstance(node, ast.Subscript):
            node = node.value
        return isinstance(node, ast.Attribute) and _is_record(node.value)

    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and _field_of_record(node.func.value):
                found.append(node.lineno)
            elif node.func.attr == "__setattr__" and node.args and _is_record(node.args[0]):
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _is_record(node.args[0]):
                found.append(node.lineno)
        flat = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        found += [node.lineno for t in flat if _field_of_record(t)]
    return found


def test_the_scan_finds_every_kind_of_mutation():
    bad = [
        "assignment.devices = []",
        "spec.assignment.notes += ['x']",
        "self.assignment.notes.append('x')",
        "assignment.split[0] = 2",
        "object.__setattr__(assignment, 'kind', 'GPU')",
        "setattr(spec, 'assignment', p)",
        "assignment.footprints, n = [], 1",
        "del assignment.memory_limits_mb[0]",
    ]
    assert [mutations(line) for line in bad] == [[1]] * len(bad)
    good = [
        "self.assignment = self.assignment.noted('x')",
        "assignment = replace(assignment, devices=d)",
        "notes.append(assignment.notes[0])",
        "spec = replace(spec, assignment=p)",
    ]
    assert [mutations(line) for line in good] == [[]] * len(good)


def test_no_module_assigns_to_a_placement_or_a_spec():
    files = [*ROOT.glob("chain/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("examples/*.py")]
    planner = ROOT / "chain" / "planning" / "planner.py"  # where `p` is always an Assignment: built whole, or replaced
    found = [
        f"{f.relative_to(ROOT)}:{line}"
        for f in files
        for line in mutations(f.read_text(), RECORDS | {"p"} if f == planner else RECORDS)
    ]
    assert planner in files and found == []
