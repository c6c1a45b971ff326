"""The docs hold together: the config reference is what the schema gives now (written by
scripts/config_reference.py, which needs no TensorFlow), the README is a front page that links
every docs page, and every relative link in the README and docs/ reaches a file and a heading."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import chain
from chain.config import schema
from chain.data.sources import SOURCES
from chain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def reference_module():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_what_the_schema_gives_and_needs_no_tensorflow():
    # tensorflow set to None in sys.modules: any import of it raises ImportError.
    code = (
        "import runpy, sys; sys.modules['tensorflow'] = None; sys.argv = ['config_reference.py', '--check']; "
        "runpy.run_path('scripts/config_reference.py', run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_reference_has_a_row_for_every_key_of_every_section():
    text = (DOCS / "config.md").read_text()
    for f in fields(schema.Settings):
        if "check" in f.metadata:
            assert f"| `{f.name}` |" in text, f.name
    sections = {
        "trainer": schema.Trainer,
        "pipeline": schema.Pipeline,
        "placement": schema.PlacementSettings,
        "checkpoint": schema.CheckpointSettings,
        "cluster": schema.ClusterSettings,
        "side_by_side": schema.SideBySideSettings,
        "oom": schema.OomSettings,
        "stage": schema.StageSpec,
        "model": schema.Mlp,
        "optim": schema.Adam,
        "data": SOURCES["tfrecord"].settings,
    }
    for name, cls in sections.items():
        for f in fields(cls):
            if "check" in f.metadata:
                row = re.search(rf"^\| `{name}\.{f.name}` \| (.+) \|$", text, re.M)
                assert row, f"{name}.{f.name}"
                assert all(cell.strip() for cell in row.group(1).split(" | ")), row.group(0)  # type, default, ...
    assert "| `trainer.profile` |" in text and "| `trainer.steps_per_call` | `int` | `8` |" in text


def test_a_field_without_help_stops_the_reference(monkeypatch):
    module = reference_module()
    bare = schema.setting(schema.string)
    assert bare.metadata["help"] == ""
    monkeypatch.setattr(module, "fields", lambda cls: [*fields(cls), _named(bare, "bare")])
    with pytest.raises(SystemExit, match="bare has no help text"):
        module.render()


def _named(f, name):
    f.name, f.type = name, "str"
    return f


def test_a_check_the_reference_cannot_describe_is_an_error_not_a_guess():
    module = reference_module()
    assert module.describe(schema.Trainer.__dataclass_fields__["on_nan"].metadata["check"]) == "`stop`, `skip`"
    with pytest.raises(SystemExit, match="no description for the check"):
        module.describe(lambda key, value: value)


def test_the_readme_is_a_front_page_that_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    targets = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", readme)}
    missing = [p.name for p in DOCS.glob("*.md") if f"docs/{p.name}" not in targets]
    assert not missing, f"docs pages not linked from README.md: {missing}"
    index = (DOCS / "index.md").read_text()
    assert not [p.name for p in DOCS.glob("*.md") if p.name != "index.md" and f"({p.name}" not in index]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", outside_code(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            bad.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{target}: no heading #{anchor} in {path.name}")
    assert not bad, bad


def test_the_slug_is_githubs():
    assert slug("Pipeline training (`mode=e2e`)") == "pipeline-training-modee2e"
    assert slug("Side by side: several experiments, one process") == "side-by-side-several-experiments-one-process"


def readme_commands() -> list[list[str]]:
    """The overrides of every `python -m chain ...` line in the README's bash blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for line in block.splitlines():
            if "python -m chain " in line:
                out.append(shlex.split(line.split("python -m chain ", 1)[1], comments=True))
    return out


def test_every_command_on_the_front_page_is_a_config_chain_accepts():
    commands = readme_commands()
    assert len(commands) >= 12
    for args in commands:
        try:
            chain.compose(args)
        except ConfigError as e:  # only the user's own files, which the examples name, may be missing
            assert re.match(r"(model|data)\.path='[\w.]+': (no such file|the file does not exist)", str(e)), (args, e)


def test_the_reference_lists_every_value_pipeline_schedule_takes():
    from chain.schedule.schedules import CHOICES

    row = re.search(r"^\| `pipeline\.schedule` \| `str` \| `\w+` \| ([^|]+) \|", (DOCS / "config.md").read_text(), re.M)
    assert row and row.group(1).strip() == ", ".join(f"`{name}`" for name in CHOICES) and "`file`" in row.group(1)


def test_benchmarks_is_a_record_under_400_lines_with_every_scripts_command():
    """docs/benchmarks.md holds each benchmark's current figures, not the diary (that is
    benchmarks-history.md): under 400 lines, every bench_*.py and stress_*.py script run by a
    command in a bash block, and every section with its table of figures and its command."""
    text = (DOCS / "benchmarks.md").read_text()
    assert len(text.splitlines()) < 400, f"docs/benchmarks.md has {len(text.splitlines())} lines"
    commands = [
        line.strip() for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M) for line in block.splitlines()
    ]
    scripts = sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name.startswith(("bench_", "stress_")))
    assert len(scripts) >= 9
    missing = [name for name in scripts if not any(c.startswith(f"python scripts/{name}") for c in commands)]
    assert not missing, f"scripts with no command in docs/benchmarks.md: {missing}"
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0]
        assert re.search(r"^\|---", section, re.M), f"no table of figures under '{title}'"
        assert "```bash\npython scripts/" in section, f"no command under '{title}'"
