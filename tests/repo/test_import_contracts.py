"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they see what they claim.

`make lint` runs the same check (`lint-imports`); here it also runs with the suite, and the
second test pins down the two facts the acyclic contract rests on: grimp counts an import made
inside a function and one made under TYPE_CHECKING, so neither can hide a cycle.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from repo_paths import REPO as ROOT


def _contracts() -> list[dict]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _of_type(kind: str) -> list[dict]:
    return [c for c in _contracts() if c["type"] == kind]


def test_the_layers_and_the_acyclic_contracts_are_configured():
    layers = [c["layers"] for c in _of_type("layers")]
    assert ["kvscope.app", "kvscope.engine", "kvscope.kernels"] in layers
    # app by product: the entry point on top, the shared layer at the bottom
    app = "kvscope.app"
    assert [
        f"{app}.cli",
        f"{app}.desktop | {app}.bench",
        f"{app}.serve | {app}.remote",
        f"{app}.core",
    ] in layers
    [acyclic] = _of_type("acyclic_siblings")
    assert set(acyclic["ancestors"]) == {"kvscope.app", "kvscope.engine", "kvscope.kernels"}


def test_the_products_are_independent_but_for_named_uses():
    [independence] = _of_type("independence")
    products = {f"kvscope.app.{name}" for name in ("desktop", "serve", "remote", "bench")}
    assert set(independence["modules"]) == products
    # each exception is one product using another, never the shared layer reaching up
    for line in independence["ignore_imports"]:
        importer, imported = (side.strip() for side in line.split("->"))
        assert importer.split(".")[2] != imported.split(".")[2], line
        assert "kvscope.app.core" not in importer, line


def test_app_has_no_loose_modules_but_its_entry_points():
    loose = sorted(p.name for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"app/ holds modules outside its product folders: {loose}"


def test_the_import_contracts_hold():
    # In a process of its own: lint-imports configures logging with disable_existing_loggers,
    # which in this process silenced every logger made before it, and the log-checking tests
    # that ran after it in the same worker failed.
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"an import contract is broken:\n{run.stdout[-4000:]}"


def test_a_lazy_or_type_only_import_still_closes_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circle import b\n\n    return b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from circle import a\n"
    )
    (package / "c.py").write_text("from circle import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circle", cache_dir=None)
    assert graph.direct_import_exists(importer="circle.a", imported="circle.b")
    assert graph.direct_import_exists(importer="circle.b", imported="circle.a")
    breakers = graph.nominate_cycle_breakers("circle")
    assert breakers and breakers <= {("circle.a", "circle.b"), ("circle.b", "circle.a")}
