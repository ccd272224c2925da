"""The app reaches the engine and the kernels only through their public surface.

Which engine modules the app may import is import-linter's contract in pyproject.toml ("the app
uses the engine through its public modules": a forbidden contract whose exceptions are those
modules; `make lint`, tests/repo/test_import_contracts.py). Which *names* of those modules are
public is each module's `__all__`. This checks the second half: every name app/**/*.py imports
from a public engine or kernels module is in that module's `__all__` (an attribute read off
`kvscope.kernels` too), and every public module declares one. engine.bench is the engine's own
benchmarks, public whole.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import tomllib
from pathlib import Path

from repo_paths import REPO as ROOT

CONTRACT = "the app uses the engine through its public modules"
ENGINE_BENCH = "kvscope.engine.bench"


def public_modules(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The modules the contract lets the app import (its `kvscope.app... -> M` exceptions)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["name"] == CONTRACT]
    return {line.split("->")[1].strip() for line in contract["ignore_imports"]}


def _module_of(parent: str, name: str) -> str | None:
    """`parent.name` when `from parent import name` imports a submodule, else None."""
    try:
        return f"{parent}.{name}" if importlib.util.find_spec(f"{parent}.{name}") else None
    except ModuleNotFoundError:
        return None


def _ours(module: str) -> bool:
    return module.split(".")[:2] in (["kvscope", "engine"], ["kvscope", "kernels"])


def _bench(module: str) -> bool:
    return module == ENGINE_BENCH or module.startswith(ENGINE_BENCH + ".")


def _exported(module: str) -> set[str]:
    return set(getattr(importlib.import_module(module), "__all__", ()))


def names_outside_all(path: Path, public: set[str]) -> set[tuple[str, str]]:
    """(module, name) for each name one file takes from a public module but not in its
    `__all__`: imported by name, or read off the module imported whole (`from kvscope import
    kernels`, then `kernels.x`). Which modules it may import at all is import-linter's."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, str]] = set()
    aliases: dict[str, str] = {}  # local name -> the public module it stands for

    def checked(module: str) -> bool:
        return module in public and not _bench(module)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and checked(alias.name):
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                whole = _module_of(node.module, alias.name)
                if whole is not None:
                    if _ours(whole) and checked(whole):
                        aliases[alias.asname or alias.name] = whole
                elif _ours(node.module) and checked(node.module):
                    if alias.name not in _exported(node.module):
                        found.add((node.module, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and node.attr not in _exported(module):
                found.add((module, node.attr))
    return found


def test_every_public_module_declares_its_names():
    missing = sorted(m for m in public_modules() if not _bench(m) and not _exported(m))
    assert not missing, f"public to the app but no __all__: {missing}"


def test_app_imports_only_names_in_all():
    public = public_modules()
    found = {
        path.relative_to(ROOT).as_posix(): names
        for path in sorted((ROOT / "app").rglob("*.py"))
        if (names := names_outside_all(path, public))
    }
    assert not found, (
        f"app imports engine/kernels names outside their __all__: {found}; use the public API "
        "or make the name public (its module's __all__)"
    )


def test_the_check_sees_names_outside_all(tmp_path):
    """The checker itself: a name outside a public module's __all__ is caught, those in it and
    a public submodule are not."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from kvscope import kernels\n"
        "from kvscope.engine import LLM\n"
        "from kvscope.engine.sizing import planner\n"
        "import kvscope.engine.kv.snapshot as snapshot\n"
        "from kvscope.engine.kv.snapshot import KVSnapshot\n"
        "from kvscope.engine.model.loader import load_model, expected_weight_shapes\n"
        "from kvscope.engine.bench.snapshot_cost import measure_snapshot_cost\n"
        "kernels.paged_decode_attention\n"
        "kernels.resolve_backend\n"
        "planner.plan_kv\n"
        "planner.DEFAULT_BLOCK\n"
        "snapshot.BlockState.FREE\n"
    )
    public = public_modules()
    assert names_outside_all(source, public) == {
        ("kvscope.engine.model.loader", "expected_weight_shapes"),
        ("kvscope.kernels", "resolve_backend"),
        ("kvscope.engine.sizing.planner", "DEFAULT_BLOCK"),
    }


def test_the_contract_names_only_modules_that_exist():
    for module in public_modules():
        name = module.removesuffix(".**")
        assert importlib.util.find_spec(name) is not None, module
