"""ARCHITECTURE.md's dependency picture is what pyproject.toml's contracts and the import graph
say, and its module tables what the modules' docstrings say: neither is a drawing that drifts
(redraw: `python tests/architecture_picture.py --write` and
`python tests/module_tables.py --write`)."""

from __future__ import annotations

import pytest


def test_the_architecture_picture_is_generated_from_the_contracts():
    pytest.importorskip("tomllib")  # Python 3.11+: the picture reads pyproject.toml with it
    from architecture_picture import block, current

    shown = current()
    assert shown is not None, "ARCHITECTURE.md lost its generated dependency picture"
    assert shown == block(), "run: python tests/architecture_picture.py --write"


def test_the_module_tables_are_generated_from_the_docstrings():
    from module_tables import block, current, undocumented

    assert undocumented() == [], "every module says what it is in its docstring"
    shown = current()
    assert shown is not None, "ARCHITECTURE.md lost its generated module tables"
    assert shown == block(), "run: python tests/module_tables.py --write"
