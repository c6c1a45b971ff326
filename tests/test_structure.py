"""The package's structure: the layer order of docs/architecture.md (every import goes to an
earlier layer), no import cycles, no reaching into another module's private names, one strategy
per way of training, and a training loop that never asks which one it drives."""

from __future__ import annotations

import ast
import functools
import inspect
import re
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
    (
        "chain.fields",
        "chain.cli",
        "chain.testhooks",
        "chain.records",
        "chain.internals",
        "chain.schedule",
        "chain.targets",
    ),  # leaves: chain.errors at most
    ("chain.data",),
    ("chain.config",),
    ("chain.planning",),
    ("chain.stages",),
    ("chain.steps",),
    ("chain.strategies",),
    ("chain.pipeline",),
    ("chain.state",),
    ("chain.report",),
    ("chain.prepared",),
    ("chain.autoplan",),  # placement.plan=auto: measuring, search, choice, table (the build settles it)
    ("chain.training",),
    ("chain.sweep", "chain.restage", "chain.generate", "chain.worker"),  # the command lines' work
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
    return {
        (layer(module), layer(target), module, target)
        for target, _ in imports(module, True, source)
        if layer(target) != layer(module)
    }


def order_violations(edges: set[tuple[str, str, str, str]]) -> list[str]:
    """One readable line per edge to the same or a later row of LAYERS."""
    out = []
    for src, dst, module, target in sorted(edges, key=str):
        if ROW[dst] >= ROW[src]:
            allowed = (
                ("only layer 1" if ROW[src] == 1 else f"only layers 1-{ROW[src]}") if ROW[src] else "no other package"
            )
            out.append(
                f"{module} imports {target}: {src} (layer {ROW[src] + 1}) may import {allowed} of LAYERS, "
                f"and {dst} is layer {ROW[dst] + 1}"
            )
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
    named; an import from chain.schedule (an earlier layer) is not; two leaves of one row may
    not import each other; the bottom row imports nothing."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "def f():\n    if TYPE_CHECKING:\n        from chain.training.run import Run\n"
        "    from chain.schedule.schedules import Action\n"
    )
    assert imports("chain.state.remap", source=source) == [("chain.schedule.schedules", ["Action"])]  # run time
    assert order_violations(package_edges("chain.state.remap", source)) == [
        "chain.state.remap imports chain.training.run: chain.state (layer 10) may import only layers 1-9 of LAYERS, "
        "and chain.training is layer 14"
    ]
    assert order_violations({("chain.fields", "chain.cli", "chain.fields", "chain.cli")}) == [  # one row: refused
        "chain.fields imports chain.cli: chain.fields (layer 2) may import only layer 1 of LAYERS, "
        "and chain.cli is layer 2"
    ]
    assert order_violations({("chain.errors", "chain.cli", "chain.errors", "chain.cli")}) == [
        "chain.errors imports chain.cli: chain.errors (layer 1) may import no other package of LAYERS, "
        "and chain.cli is layer 2"
    ]


# placement.plan=auto in one package (docs/architecture.md): a function or class named for it lives there or is
# one of its records; the config's refusals are checked before TensorFlow starts, so they stay in the config
AUTO_PLAN_WORDS = re.compile(
    r"auto_?plan|candidate|cost_?(cache|key|file)|^costs$|plan_?(table|timing|choice|check|fields)", re.I
)
AUTO_PLAN_HOMES = ("chain.autoplan", "chain.records.auto_plan", "chain.records.summaries")  # summary.json's plan
AUTO_PLAN_ELSEWHERE = {"chain.config.checks.check_auto_plan"}
AUTO_PLAN_CALLERS = {  # what the rest of chain takes from the package: the build settles, the loop shows and checks
    "chain.training.build",
    "chain.training.run",
    "chain.training.cadence",
    "chain.__main__",
}


def in_package(module: str, packages: tuple[str, ...]) -> bool:
    """Whether `module` is one of `packages` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def auto_plan_strays(modules: dict[str, Path]) -> list[str]:
    """`module.name` of each function or class named for plan=auto (AUTO_PLAN_WORDS) outside its homes."""
    return sorted(
        f"{m}.{node.name}"
        for m, path in modules.items()
        if not in_package(m, AUTO_PLAN_HOMES)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and AUTO_PLAN_WORDS.search(node.name)
        if f"{m}.{node.name}" not in AUTO_PLAN_ELSEWHERE
    )


def test_plan_auto_lives_in_one_package():
    """Measuring, search, cache, choice, table, the settling of a run and the step check are chain.autoplan's
    modules, their records chain.records.auto_plan's: nothing named for plan=auto is defined elsewhere, and only
    the build, the loop and the command line import the package."""
    assert auto_plan_strays(MODULES) == []
    importers = {
        m
        for m in MODULES
        if not in_package(m, ("chain.autoplan",))
        and any(in_package(t, ("chain.autoplan",)) for t, _ in imports(m, typing=True))
    }
    assert importers == AUTO_PLAN_CALLERS
    assert layer("chain.autoplan.search") == "chain.autoplan" and ROW["chain.prepared"] < ROW["chain.autoplan"]


def graph() -> dict[str, set[str]]:
    """module -> modules it imports, at run time, inside functions or under `if TYPE_CHECKING:`
    alike (docs/architecture.md: a cycle hidden by deferring one side is still a cycle): the
    imported module and every package above it that the importer is not itself inside
    (importing chain.a.b runs chain/a/__init__.py)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _ in imports(m, typing=True):
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
                return stack[stack.index(n) :] + [n]
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

    sources = {name: (PACKAGE / "pipeline" / f"{name}.py").read_text() for name in ("timeline", "play", "strategy")}
    for name, source in sources.items():
        imported = {
            alias.name
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
        assert "re" not in imported, name
    assert "Action.parse(" in sources["timeline"] and ".scope()" in sources["play"]
    assert "name=DONE" in sources["play"] and '"done"' not in sources["timeline"] + sources["play"]
    assert timeline.COPY_PREFIX == ops.COPY_PREFIX


def test_the_schedule_vocabulary_imports_nothing_of_chain():
    """`chain.schedule.schedules` is the schedules as data and the op-name vocabulary: it and
    its package's `__init__` import nothing of chain, so the config and the TensorFlow-free readers
    of a schedule (the timeline, the report) take it without the step or its strategy."""
    assert imports("chain.schedule.schedules") == [] and imports("chain.schedule") == []
    assert imports("chain.pipeline") == []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_the_cycle_graph_counts_type_checking_and_function_level_imports(monkeypatch, tmp_path):
    """An import inside a function and one under `if TYPE_CHECKING:` are each an edge of the cycle
    graph, and the cycle they close is found."""
    (tmp_path / "memory.py").write_text("def f():\n    from chain.planning import inventory\n")
    (tmp_path / "inventory.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chain.planning.memory import peak_bytes\n"
    )
    for name in ("memory", "inventory"):  # chain.planning.memory and .inventory, as if they held these imports
        monkeypatch.setitem(MODULES, f"chain.planning.{name}", tmp_path / f"{name}.py")
    edges = graph()
    assert edges["chain.planning.memory"] == {"chain.planning.inventory"}  # inside a function
    assert edges["chain.planning.inventory"] == {"chain.planning.memory"}  # for type checking
    assert find_cycle(edges) == ["chain.planning.inventory", "chain.planning.memory", "chain.planning.inventory"]


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
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                offenders.append((m, node.value.id, node.attr))
    assert offenders == []


# TensorFlow's, Keras' and Hydra's private parts: only chain.internals reaches them (docs/architecture.md).
LIBRARIES = ("tensorflow", "keras", "hydra", "omegaconf", "absl", "tsl", "tf_keras")
PRIVATE_PACKAGES = (
    "keras.src",
    "tensorflow.python",
    "tensorflow.core",
    "tensorflow.tsl",
    "tensorflow.compiler",
    "tsl",
    "hydra._internal",
)
PRIVATE_SUBMODULES = {"src", "python", "core", "tsl", "compiler", "__internal__"}  # `keras.src`, `tf.python`, ...
# The private names chain used before they moved into chain.internals: refused on any object, even
# where chain happens to define the same name for itself (`chain.state.manifest._layers`).
KNOWN_PRIVATE = {
    "_nodes_by_depth",
    "_run_through_graph",
    "_standardize_inputs",
    "_layers",
    "_flatten_layers",
    "_moments",
    "_add_control_input",
    "_as_serialized_graph",
    "_trainable_variables",
    "_get_variable_index",
    "_momentums",
    "_velocities",
    "_keras_mask",
}
PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"}  # a named tuple's, os._exit
INTERNALS = "chain.internals"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_private_names(trees) -> set[str]:
    """The private names chain defines itself: its functions, classes, module names, and the
    attributes and fields it assigns (`self._x = ...`, `_x: int = ...`)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return {n for n in names if _private(n)}


def library_private_reaches(tree: ast.AST, own: set[str]) -> list[str]:
    """What `tree` reaches of a library's private parts: imports of a private package of TensorFlow,
    Keras or Hydra (`keras.src`, `tensorflow.python`, `hydra._internal`, any `_` part), their private
    submodules by attribute (`keras.src`, `tf.python`), and `x._name` (or `getattr(x, "_name")`,
    `object.__setattr__(x, "_name", ...)`) for a private name chain does not define itself (`own`)
    or one of KNOWN_PRIVATE."""

    def private_module(name: str) -> bool:
        parts = name.split(".")
        return parts[0] in LIBRARIES and (
            any(name == p or name.startswith(p + ".") for p in PRIVATE_PACKAGES)
            or any(_private(part) for part in parts)
        )

    def private_attribute(name: str) -> bool:
        return _private(name) and name not in PUBLIC and (name in KNOWN_PRIVATE or name not in own)

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"import {a.name}" for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if private_module(node.module):
                out.append(f"from {node.module} import ...")
            elif node.module.split(".")[0] in LIBRARIES:
                out += [
                    f"from {node.module} import {a.name}"
                    for a in node.names
                    if private_module(f"{node.module}.{a.name}")
                ]
        elif isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id in ("tf", *LIBRARIES)
                and node.attr in PRIVATE_SUBMODULES
            ):
                out.append(f"{node.value.id}.{node.attr}")
            elif private_attribute(node.attr):
                out.append(f".{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and node.args[1:]
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private_attribute(node.args[1].value)
            and ast.unparse(node.func)
            in (
                "getattr",
                "setattr",
                "hasattr",
                "delattr",
                "object.__setattr__",
                "object.__getattribute__",
                "object.__delattr__",
            )
        ):
            out.append(f"{ast.unparse(node.func)}(..., {node.args[1].value!r})")
    return out


def test_only_the_internals_modules_reach_private_names_of_tensorflow_keras_and_hydra():
    """`keras.src`, `tensorflow.python`, `tensorflow.tsl`, `hydra._internal` and the private
    attributes of TensorFlow's and Keras' objects appear only in chain.internals (in chain/ and scripts/)."""
    scripts = {f"scripts.{p.stem}": p for p in (ROOT / "scripts").glob("*.py")}
    trees = {m: ast.parse(p.read_text()) for m, p in {**MODULES, **scripts}.items()}
    own = defined_private_names(t for m, t in trees.items() if not m.startswith(INTERNALS))
    offenders = {
        m: found
        for m, tree in trees.items()
        if not m.startswith(INTERNALS) and (found := library_private_reaches(tree, own))
    }
    assert offenders == {}


def test_the_private_reach_check_finds_each_kind_of_reach():
    """Each pattern chain once used outside chain.internals is found; chain's own private names,
    a named tuple's `_replace` and public TensorFlow are not."""
    source = (
        "from keras.src import tree\nimport tensorflow.python.eager.context\n"
        "from hydra._internal.utils import get_args_parser\nfrom tensorflow.tsl.profiler import x\n"
        "from tensorflow import python\nfrom keras import src\n"
        "def f(model, op, layer, opt, a):\n"
        "    model._nodes_by_depth\n    op._add_control_input(a)\n    layer._layers\n"
        "    object.__setattr__(layer, '_moments', a)\n    getattr(opt, '_momentums')\n"
        "    opt._unheard_of\n    keras.src.tree\n    tf.python\n"
        "    a._replace(k=1)\n    a._mine\n    tf.raw_ops.Add\n    keras.tree.flatten(a)\n"
    )
    assert sorted(library_private_reaches(ast.parse(source), own={"_mine", "_layers"})) == sorted(
        [
            "from keras.src import ...",
            "import tensorflow.python.eager.context",
            "from hydra._internal.utils import ...",
            "from tensorflow.tsl.profiler import ...",
            "from tensorflow import python",
            "from keras import src",
            "object.__setattr__(..., '_moments')",
            "getattr(..., '_momentums')",
            "._nodes_by_depth",
            "._add_control_input",
            "._layers",
            "._unheard_of",
            "keras.src",
            "tf.python",
        ]
    )


def test_every_module_says_what_it_holds():
    missing = [m for m, p in MODULES.items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_one_strategy_per_placement_and_mode():
    from chain.config.schema import MODES
    from chain.planning.planner import MIRRORED, PIPELINE, REPLICATED
    from chain.training.ways import TABLE

    chains = [m for m in MODES if m != "side_by_side"]  # independent models are never mirrored (config checks)
    assert set(TABLE) == (
        {(p, m) for p in (PIPELINE, MIRRORED) for m in chains} | {(PIPELINE, "side_by_side")} | {(REPLICATED, "e2e")}
    )  # copies of a pipeline: mode=e2e only (config checks)
    assert len(set(TABLE.values())) == len(TABLE)


def test_every_way_of_training_learns_its_modes_objective():
    """What restage asks (`chain.strategies.objectives.objective`) is what the run's strategy
    builds: every way of a mode gives its distribution that mode's objective, whose answers
    (`heads`, `readout`, `chained`) the strategy builds its stages with."""
    from chain.strategies.objectives import objective
    from chain.training.ways import TABLE

    for (_, mode), way in TABLE.items():
        assert way.objective is objective(mode), (way, mode)


def test_a_way_of_training_is_a_distribution_given_an_objective():
    """Composition, not a class per pair: no distribution is an objective (nor the reverse), each
    of the table's classes is complete (nothing abstract left: `inspect.isabstract`), a
    distribution serves every objective the table gives it (the mirrored one both), and no
    strategy or objective has a method that raises NotImplementedError."""
    from chain.strategies.base import Strategy
    from chain.strategies.objectives import Objective
    from chain.training.ways import TABLE

    for way in TABLE.values():
        assert issubclass(way.distribution, Strategy) and not issubclass(way.distribution, Objective), way
        assert issubclass(way.objective, Objective) and not issubclass(way.objective, Strategy), way
        assert not inspect.isabstract(way.distribution) and not inspect.isabstract(way.objective), way
    assert len({way.distribution for way in TABLE.values()}) < len(TABLE)  # one distribution, two objectives
    files = [
        *(PACKAGE / "strategies").glob("*.py"),
        PACKAGE / "pipeline" / "strategy.py",
        PACKAGE / "pipeline" / "replicas.py",
    ]
    raising = [f.name for f in files if "NotImplementedError" in f.read_text()]
    assert raising == []


def _attributes_used_on(name: str, path: Path) -> set[str]:
    """The attributes read from a variable or attribute called `name` in `path` (`strategy.call`,
    `self.strategy.read`, `run.strategy.plan_text`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == name) or (
                isinstance(owner, ast.Attribute) and owner.attr == name
            ):
                found.add(node.attr)
    return found


def test_every_strategy_method_the_run_calls_is_on_the_interface():
    """`Run` and everything around it (the build, the profile, the stall watch, the command line)
    call only what `chain.strategies.base.Strategy` declares (or sets in its constructor), so a
    distribution is never asked for a method only another has (as `timeline()` once was)."""
    from chain.strategies.base import Strategy

    tree = ast.parse((PACKAGE / "strategies" / "base.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Strategy"]
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    set_in_init = {
        t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)
    } | {t.target.attr for t in ast.walk(init) if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Attribute)}
    declared = set(dir(Strategy)) | set_in_init | set(Strategy.__annotations__)
    callers = [*(PACKAGE / "training").glob("*.py"), PACKAGE / "__main__.py"]
    used = {(f.name, a) for f in callers for a in _attributes_used_on("strategy", f)}
    assert ("run.py", "timeline") in used  # the check sees what the loop calls
    assert sorted((f, a) for f, a in used if a not in declared) == []


def test_the_training_loop_does_not_branch_on_the_mode():
    from chain.training.run import Run

    source = inspect.getsource(Run)
    for word in ('"e2e"', '"local"', "mode ==", "mode !=", "isinstance(self.strategy", "MIRRORED", "PIPELINE"):
        assert word not in source, word


def stream_records(package: Path) -> set[str]:
    """The classes of what a streamed data set is (`Dataset.shards`): every class of
    chain/data/streamed.py and of a source's record module (`*_record.py`, or the old `shards.py`)."""
    data = package / "data"
    found = [data / "streamed.py", data / "shards.py", *data.rglob("*_record.py")]
    return {
        n.name for f in found if f.exists() for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef)
    }


def isinstance_over(tree: ast.AST, classes: set[str]) -> list[str]:
    """The classes of `classes` that an `isinstance(...)` in `tree` tests against."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            out += [n for k in kinds if (n := getattr(k, "id", None) or getattr(k, "attr", None)) in classes]
    return out


def test_chain_data_does_not_dispatch_with_isinstance_over_stream_records():
    """A streamed data set opens its own stream (`chain.data.streamed.Streamed`): no module of chain/data
    asks which record it holds."""
    classes = stream_records(PACKAGE)
    assert "FileCounts" in classes  # the check sees the records
    found = {
        f"{module_name(p)}: isinstance over {', '.join(names)}"
        for p in (PACKAGE / "data").rglob("*.py")
        if (names := isinstance_over(ast.parse(p.read_text()), classes))
    }
    assert sorted(found) == []
    assert isinstance_over(ast.parse("isinstance(s, (Shards, CsvFiles))"), {"Shards", "CsvFiles"}) == [
        "Shards",
        "CsvFiles",
    ]


@pytest.mark.parametrize(
    "module",
    [
        "chain",
        "chain.prepared",
        "chain.config",
        "chain.schedule.schedules",
        "chain.schedule.schedule_file",
        "chain.pipeline.timeline",
        "chain.pipeline.idle",
        "chain.pipeline.memory_trace",
        "chain.pipeline.stalled",
        "chain.planning.planner",
        "chain.autoplan.choice",
        "chain.autoplan.table",
        "chain.data.catalog",
        "chain.__main__",
    ],
)
def test_modules_before_the_build_do_not_import_tensorflow(module):
    import subprocess
    import sys

    code = f"import sys, {module}; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_a_test_that_needs_no_tensorflow_runs_in_a_process_that_never_imports_it():
    """tests/conftest.py sets the logical devices when TensorFlow is first imported, not by importing it."""
    import subprocess
    import sys

    code = (
        "import sys, pytest; "
        "code = pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_schedules.py']); "
        "sys.exit(code or 99 * ('tensorflow' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


# --- one word per idea: the glossary's names exist, the names they replaced are gone ---------------------

# Names that meant two things, or hid what comes back, and what replaced them (docs/architecture.md, "Words").
RETIRED = {
    "Placement": "Assignment",
    "Placing": "Rows",
    "placing": "rows",
    "placement_rule": "rows_rule",
    "v_placement": "v_rows",
    "Pipelined": "DevicePerStage",
    "PlayPlan": "Playbook",
    "play_plan": "playbook",
    "piece_times": "link_times",
    "repeated": "later_copies",
    "plan_cluster": "assign_cluster",
    "plan_multi_worker": "assign_multi_worker",
    "Measured": "MeasuredTimeline, LinkTimes or Measurement",
}
RETIRED_DEFS = {  # (module, name) -> what replaced a function named for what it did, not what it returns
    ("chain.autoplan.choice", "planned"): "chosen_spec",
    ("chain.autoplan.settle", "measured"): "measurement",
    ("chain.autoplan.search", "replay"): "step_and_bubble",
    ("chain.pipeline.idle", "replay"): "step_and_bubble",
}
RETIRED_MODULES = ("chain/strategies/pipelined.py", "chain/pipeline/step.py")
RETIRED_FIELDS = {  # (module, class) -> fields it no longer has
    ("chain.schedule.schedules", "Schedule"): {"placement"},
    ("chain.prepared.run_spec", "RunSpec"): {"placement"},
    ("chain.planning.planner", "Assignment"): {"layout"},
    ("chain.strategies.base", "Strategy"): {"placement"},
    ("chain.training.run", "Run"): {"placement"},
}


def glossary_names(text: str) -> list[str]:
    """The dotted `chain.` names the glossary (docs/architecture.md's "## Words") says things live at."""
    words = text.split("\n## Words\n", 1)[1].split("\n## ", 1)[0]
    return sorted({n for n in re.findall(r"`(chain\.[\w.]+)`", words)})


def _defines(body: list[ast.stmt], name: str) -> bool:
    """Whether a module's or class's `body` defines `name` (a def, a class, an assignment, a field, an import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":  # `self.name = ...` in a constructor
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and sub.attr == name:
                    return True
    return False


def _class_body(tree: ast.Module, name: str) -> list[ast.stmt] | None:
    return next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def missing(dotted: str) -> str | None:
    """Why `dotted` (`chain.module.Name.attr`) names nothing in the code, or None when it does."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in MODULES:
            break
    else:
        return f"{dotted}: no such module"
    rest = parts[cut:]
    if not rest:
        return None
    body = ast.parse(MODULES[module].read_text()).body
    if not _defines(body, rest[0]):
        return f"{dotted}: {module} defines no {rest[0]}"
    if len(rest) > 1:
        inner = _class_body(ast.Module(body=body, type_ignores=[]), rest[0])
        if inner is None or not _defines(inner, rest[1]):
            return f"{dotted}: {module}.{rest[0]} has no {rest[1]}"
    return None


def retired_uses(trees: dict[str, ast.AST]) -> list[str]:
    """Where a retired name is still defined or used in `trees` (module -> parsed source)."""
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else node.name
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                else node.arg
                if isinstance(node, ast.arg)
                else node.name.rpartition(".")[2]
                if isinstance(node, ast.alias)
                else None
            )
            if name in RETIRED:
                found.append(f"{module}:{node.lineno}: {name} (now {RETIRED[name]})")
    return found


def test_every_name_of_the_glossary_exists_and_the_words_it_replaced_are_gone():
    names = glossary_names((ROOT / "docs" / "architecture.md").read_text())
    assert len(names) > 20  # the section is there and names where its words live
    assert [m for m in map(missing, names) if m] == []
    trees = {module: ast.parse(path.read_text()) for module, path in MODULES.items()}
    assert retired_uses(trees) == []
    assert [p for p in RETIRED_MODULES if (ROOT / p).exists()] == []
    for (module, cls), fields in RETIRED_FIELDS.items():
        body = _class_body(trees[module], cls)
        assert body is not None, f"{module} has no class {cls}"
        assert [f for f in fields if _defines(body, f)] == [], f"{module}.{cls}"
    assert [f"{m}.{n} (now {new})" for (m, n), new in RETIRED_DEFS.items() if _defines(trees[m].body, n)] == []
    schema = trees["chain.config.schema"]
    assert _class_body(schema, "Body") is None and _class_body(schema, "BodySettings") is not None


def test_the_word_checks_find_a_missing_name_and_a_retired_one():
    assert missing("chain.schedule.schedules.Schedule.stage_rows") is None
    assert missing("chain.schedule.schedules.Schedule.placement") is not None
    assert (
        missing("chain.strategies.pipelined.Pipelined")
        == "chain.strategies.pipelined.Pipelined: chain.strategies defines no pipelined"
    )
    old = {"m": ast.parse("from x import Placement\n\ndef f(placing): return later.repeated()\n")}
    assert [line.split(": ", 1)[1] for line in retired_uses(old)] == [
        "Placement (now Assignment)",
        "placing (now rows)",
        "repeated (now later_copies)",
    ]


FUNCTION_LINES = 80  # issue 50: a function longer than this is cut into named parts


def long_functions(root: Path) -> list[str]:
    """Every function or method under `root` longer than FUNCTION_LINES (decorators to its last line, as formatted)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - first + 1 > FUNCTION_LINES:
                    out.append(
                        f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({node.end_lineno - first + 1} lines)"
                    )
    return out


def test_no_function_in_chain_is_over_80_lines():
    assert not long_functions(ROOT / "chain")


def test_the_length_check_finds_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    assert long_functions(tmp_path) == [f"{tmp_path.name}/m.py:1 f ({FUNCTION_LINES + 1} lines)"]
