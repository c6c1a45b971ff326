"""The package's structure: no import cycles, no reaching into another module's private names,
one strategy per way of training, and a training loop that never asks which one it drives."""

from __future__ import annotations

import ast
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


def imports(module: str) -> list[tuple[str, list[str]]]:
    """Every chain import `module` executes, at any depth (imports inside functions count:
    deferring an import hides a cycle from Python, not from the design)."""
    tree = ast.parse(MODULES[module].read_text())
    return [r for node in _runtime_nodes(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for r in resolve(module, node)]


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
    """The timeline parses op names only through `Action.parse` (no second grammar to drift)."""
    source = (PACKAGE / "pipeline" / "timeline.py").read_text()
    assert "import re" not in source and "re.compile" not in source
    assert "Action.parse(" in source and ".scope()" in (PACKAGE / "pipeline" / "step.py").read_text()


def test_the_schedule_vocabulary_is_a_leaf_every_layer_may_import():
    """The config takes the schedule names from `chain.pipeline.schedules`: it and its package's
    `__init__` import nothing of chain (docs/architecture.md, the layers)."""
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
    from chain.planning.planner import MIRRORED, PIPELINE
    from chain.strategies import TABLE

    chains = [m for m in MODES if m != "side_by_side"]  # independent models are never mirrored (config checks)
    assert set(TABLE) == {(p, m) for p in (PIPELINE, MIRRORED) for m in chains} | {(PIPELINE, "side_by_side")}
    assert len(set(TABLE.values())) == len(TABLE)


def test_the_training_loop_does_not_branch_on_the_mode():
    from chain.training.run import Run

    source = inspect.getsource(Run)
    for word in ('"e2e"', '"local"', "mode ==", "mode !=", "isinstance(self.strategy", "MIRRORED", "PIPELINE"):
        assert word not in source, word


@pytest.mark.parametrize("module", ["chain", "chain.config", "chain.pipeline.schedules", "chain.pipeline.timeline",
                                    "chain.planning.planner",
                                    "chain.data.catalog", "chain.__main__"])
def test_modules_before_the_build_do_not_import_tensorflow(module):
    import subprocess
    import sys

    code = f"import sys, {module}; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_lower_layers_import_no_later_one():
    """chain.fields is a leaf; chain.data imports no config; chain.config neither the planner nor the
    pipeline (their names and checks reach it the other way: chain.spec checks the schedule's name);
    `if TYPE_CHECKING:` imports count."""
    def reached(package: str) -> set[str]:
        found = set()
        for m in (m for m in MODULES if m == package or m.startswith(package + ".")):
            tree = ast.parse(MODULES[m].read_text())
            found |= {target for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                      for target, _ in resolve(m, node)}
        return found

    def within(targets: set[str], *packages: str) -> set[str]:
        return {t for t in targets if any(t == p or t.startswith(p + ".") for p in packages)}

    assert reached("chain.fields") <= {"chain.errors"}
    assert within(reached("chain.data"), "chain.config", "chain.planning", "chain.pipeline", "chain.spec") == set()
    assert within(reached("chain.config"), "chain.planning", "chain.pipeline", "chain.spec", "chain.training") == set()
    assert within(reached("chain.spec"), "chain.training", "chain.strategies", "chain.steps", "chain.stages") == set()
