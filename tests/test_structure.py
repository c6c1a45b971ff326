"""The package's structure: the layer order of docs/architecture.md (every import goes to an
earlier layer), no import cycles, no reaching into another module's private names, one strategy
per way of training, and a training loop that never asks which one it drives."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "chain"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(importer: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for one import statement, chain modules only."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names if a.name.split(".")[0] == "chain"]
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}".rstrip(".")
    if base.split(".")[0] != "chain":
        return []
    out = []
    for alias in node.names:  # `from chain.steps import xla` imports the module chain.steps.xla
        sub = f"{base}.{alias.name}"
        out.append((sub, []) if sub in MODULES else (base, [alias.name]))
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (annotations only: never executed)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(module: str, typing: bool = False, source: str | None = None) -> list[tuple[str, list[str]]]:
    """Every chain import `module` executes, at any depth (imports inside functions count:
    deferring an import hides a cycle from Python, not from the design); with `typing`, those
    under `if TYPE_CHECKING:` too. `source`: this text instead of the module's file."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    nodes = ast.walk(tree) if typing else _runtime_nodes(tree)
    return [r for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom)) for r in resolve(module, node)]


# The layers, bottom first (docs/architecture.md, "The layers"): a module may import its own
# package and the packages of earlier rows only, at run time or for type checking alike.
LAYERS: list[tuple[str, ...]] = [
    ("chain.errors",),  # the exceptions: import nothing of chain
    ("chain.fields", "chain.cli", "chain.testhooks", "chain.records"),  # leaves: chain.errors at most
    ("chain.data",),
    ("chain.config",),
    ("chain.planning",),
    ("chain.stages",),
    ("chain.steps",),
    ("chain.strategies",),
    ("chain.pipeline",),
    ("chain.state",),
    ("chain.report",),
    ("chain.spec",),
    ("chain.training",),
    ("chain.sweep", "chain.restage", "chain.worker"),  # the command lines' work
    ("chain", "chain.__main__"),  # `python -m chain` (it runs `chain.sweep` for --multirun)
]
ROW = {package: row for row, packages in enumerate(LAYERS) for package in packages}

def layer(module: str) -> str | None:
    """The package of LAYERS that `module` belongs to (`chain` itself only as the package
    __init__), or None."""
    if module in ROW:
        return module
    found = [p for p in ROW if p != "chain" and module.startswith(p + ".")]
    return max(found, key=len) if found else None


def package_edges(module: str, source: str | None = None) -> set[tuple[str, str, str, str]]:
    """(importer's layer, imported layer, importer, imported) for every import in `module` that
    leaves its package, TYPE_CHECKING imports included."""
    return {(layer(module), layer(target), module, target) for target, _ in imports(module, True, source)
            if layer(target) != layer(module)}


def order_violations(edges: set[tuple[str, str, str, str]]) -> list[str]:
    """One readable line per edge to the same or a later row of LAYERS."""
    out = []
    for src, dst, module, target in sorted(edges, key=str):
        if ROW[dst] >= ROW[src]:
            allowed = (f"only layer 1" if ROW[src] == 1 else f"only layers 1-{ROW[src]}") if ROW[src] else "no other package"
            out.append(f"{module} imports {target}: {src} (layer {ROW[src] + 1}) may import {allowed} of LAYERS, "
                       f"and {dst} is layer {ROW[dst] + 1}")
    return out


@functools.cache
def all_package_edges() -> frozenset[tuple[str, str, str, str]]:
    """Every edge between packages in chain/ (read once per session)."""
    return frozenset(e for m in MODULES for e in package_edges(m))


def test_every_module_belongs_to_a_layer():
    assert [m for m in MODULES if layer(m) is None] == []


def test_every_import_goes_to_an_earlier_layer():
    """The documented order holds, TYPE_CHECKING imports and imports inside functions included."""
    violations = order_violations(all_package_edges())
    assert violations == [], "\n".join(violations)


def test_the_order_check_names_an_edge_to_a_later_layer():
    """A TYPE_CHECKING import inside a function of chain.state, from chain.training, is found and
    named; an import from chain.pipeline (an earlier layer) is not; two leaves of one row may
    not import each other; the bottom row imports nothing."""
    source = ("from typing import TYPE_CHECKING\n"
              "def f():\n    if TYPE_CHECKING:\n        from chain.training.run import Run\n"
              "    from chain.pipeline.schedules import Action\n")
    assert imports("chain.state.remap", source=source) == [("chain.pipeline.schedules", ["Action"])]  # run time
    assert order_violations(package_edges("chain.state.remap", source)) == [
        "chain.state.remap imports chain.training.run: chain.state (layer 10) may import only layers 1-9 of LAYERS, "
        "and chain.training is layer 13"]
    assert order_violations({("chain.fields", "chain.cli", "chain.fields", "chain.cli")}) == [  # one row: refused
        "chain.fields imports chain.cli: chain.fields (layer 2) may import only layer 1 of LAYERS, "
        "and chain.cli is layer 2"]
    assert order_violations({("chain.errors", "chain.cli", "chain.errors", "chain.cli")}) == [
        "chain.errors imports chain.cli: chain.errors (layer 1) may import no other package of LAYERS, "
        "and chain.cli is layer 2"]


def graph() -> dict[str, set[str]]:
    """module -> modules it makes Python execute: the imported module and every package above it
    that the importer is not itself inside (importing chain.a.b runs chain/a/__init__.py)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _ in imports(m):
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in MODULES and step != m and not m.startswith(step + "."):
                    edges[m].add(step)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_package_has_no_import_cycles():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def shared_basenames(package: Path) -> dict[str, list[str]]:
    """Basename -> the modules under `package` that share it (`__init__`, `__main__` aside)."""
    by_name: dict[str, list[str]] = {}
    for p in sorted(package.rglob("*.py")):
        if p.stem not in ("__init__", "__main__"):
            by_name.setdefault(p.name, []).append(str(p.relative_to(package.parent)))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_no_two_modules_share_a_basename():
    """A name says what a module holds: `pipeline.py` is the pipeline step, nothing else."""
    assert shared_basenames(PACKAGE) == {}


def test_the_basename_check_finds_a_repeated_name(tmp_path):
    for path in ("pkg/a/build.py", "pkg/b/build.py", "pkg/a/__init__.py", "pkg/b/__init__.py", "pkg/c.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert shared_basenames(tmp_path / "pkg") == {"build.py": ["pkg/a/build.py", "pkg/b/build.py"]}


def test_op_names_are_read_back_in_the_steps_own_vocabulary():
    """The timeline parses op names only through `Action.parse` (no second grammar to drift), and
    the other names it reads are the step's own constants: no regular expression in the pipeline,
    no op name spelled out twice."""
    from chain.pipeline import timeline
    from chain.steps import ops

    sources = {name: (PACKAGE / "pipeline" / f"{name}.py").read_text() for name in ("timeline", "step", "strategy")}
    for name, source in sources.items():
        imported = {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module for node in ast.walk(ast.parse(source))
                                                if isinstance(node, ast.ImportFrom)}
        assert "re" not in imported, name
    assert "Action.parse(" in sources["timeline"] and ".scope()" in sources["step"]
    assert "name=DONE" in sources["step"] and '"done"' not in sources["timeline"] + sources["step"]
    assert timeline.COPY_PREFIX == ops.COPY_PREFIX


def test_the_schedule_vocabulary_imports_nothing_of_chain():
    """`chain.pipeline.schedules` is the schedules as data and the op-name vocabulary: it and
    its package's `__init__` import nothing of chain, so the TensorFlow-free readers of a
    schedule (the timeline, the report) take it without the step or its strategy."""
    assert imports("chain.pipeline.schedules") == [] and imports("chain.pipeline") == []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_no_module_imports_another_modules_private_names():
    """Neither `from chain.x import _name` nor `x._name` on a chain module, in chain/ or scripts/."""
    scripts = {f"scripts.{p.stem}": p for p in (ROOT / "scripts").glob("*.py")}
    offenders = []
    for m, path in {**MODULES, **scripts}.items():
        tree = ast.parse(path.read_text())
        modules = set()  # local names bound to chain modules
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("chain")}
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chain"):
                offenders += [(m, node.module, a.name) for a in node.names if a.name.startswith("_")]
                modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                offenders.append((m, node.value.id, node.attr))
    assert offenders == []


def test_every_module_says_what_it_holds():
    missing = [m for m, p in MODULES.items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_one_strategy_per_placement_and_mode():
    from chain.config.schema import MODES
    from chain.planning.planner import MIRRORED, PIPELINE, REPLICATED
    from chain.training.ways import TABLE

    chains = [m for m in MODES if m != "side_by_side"]  # independent models are never mirrored (config checks)
    assert set(TABLE) == ({(p, m) for p in (PIPELINE, MIRRORED) for m in chains} | {(PIPELINE, "side_by_side")}
                          | {(REPLICATED, "e2e")})  # copies of a pipeline: mode=e2e only (config checks)
    assert len(set(TABLE.values())) == len(TABLE)


def test_every_way_of_training_learns_its_modes_objective():
    """What restage asks (`chain.strategies.objectives.objective`) is what the run's strategy
    builds: every strategy of a mode subclasses that mode's objective and keeps its answers."""
    from chain.strategies.objectives import objective
    from chain.training.ways import TABLE

    for (_, mode), kind in TABLE.items():
        answer = objective(mode)
        assert issubclass(kind, answer), (kind, answer)
        assert (kind.heads, kind.readout, kind.chained) == (answer.heads, answer.readout, answer.chained), kind


def test_the_training_loop_does_not_branch_on_the_mode():
    from chain.training.run import Run

    source = inspect.getsource(Run)
    for word in ('"e2e"', '"local"', "mode ==", "mode !=", "isinstance(self.strategy", "MIRRORED", "PIPELINE"):
        assert word not in source, word


@pytest.mark.parametrize("module", ["chain", "chain.spec", "chain.config", "chain.pipeline.schedules", "chain.pipeline.timeline",
                                    "chain.pipeline.idle", "chain.pipeline.memory_trace", "chain.pipeline.stalled",
                                    "chain.planning.planner",
                                    "chain.data.catalog", "chain.__main__"])
def test_modules_before_the_build_do_not_import_tensorflow(module):
    import subprocess
    import sys

    code = f"import sys, {module}; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr

