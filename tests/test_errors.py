"""The one reading of an exception for a user-facing line (`chain.errors.first_line`,
`chain.errors.instantiate_error`), and no module reading it its own way."""

from __future__ import annotations

import pathlib
import re

from chain.errors import first_line

CHAIN = pathlib.Path(__file__).resolve().parent.parent / "chain"
# The idioms the helpers replace: a first line taken by hand, and Hydra's error class read outside chain.errors.
IDIOMS = re.compile(r"splitlines\(\)\[0\]|\.splitlines\(\)\s*$|InstantiationException|def _first_line", re.M)


def test_first_line_names_the_type_and_takes_the_first_line_or_the_type_alone():
    assert first_line(ValueError("bad shape\n  at layer 3\n")) == "ValueError: bad shape"
    assert first_line(ValueError("  \n")) == "ValueError"
    assert first_line(OSError("no such file\nmore"), typed=False) == "no such file"
    assert first_line(RuntimeError(), typed=False) == "RuntimeError"


def test_no_module_reads_an_exceptions_first_line_or_hydras_errors_its_own_way():
    found = [
        f"{p.relative_to(CHAIN.parent)}:{text[: m.start()].count(chr(10)) + 1}"
        for p in sorted(CHAIN.rglob("*.py"))
        if p.name != "errors.py" or p.parent != CHAIN
        for text in [p.read_text()]
        for m in IDIOMS.finditer(text)
    ]
    assert found == []
