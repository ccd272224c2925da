"""Module sizes and formatting: a module (or test module) past 400 lines gets a warning (it may
hold two concepts), past 600 it fails; and in the product's code `# fmt: skip` only keeps a data
table in the shape a reader scans, never squeezes code under a limit."""

from __future__ import annotations

import ast
import warnings

from repo_paths import REPO as ROOT

WARN_LINES = 400
MAX_LINES = 600
PACKAGES = ("app", "engine", "kernels")
DATA = (ast.List, ast.Tuple, ast.Dict, ast.Set)


def _modules(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_is_over_the_line_limit():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules(*PACKAGES, "tests")
    }
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines, split by concept: {over}"
    long = {name: n for name, n in sizes.items() if n > WARN_LINES}
    if long:
        warnings.warn(f"over {WARN_LINES} lines, two concepts? {long}", stacklevel=1)


def _data_table_lines(tree: ast.Module) -> set[int]:
    """The lines on which a literal list, tuple, dict or set that is assigned or returned ends."""
    ends = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)) and isinstance(
            node.value, DATA
        ):
            ends.add(node.value.end_lineno)
    return ends


def fmt_skips_outside_tables(source: str) -> list[int]:
    tree = ast.parse(source)
    tables = _data_table_lines(tree)
    return [
        number
        for number, line in enumerate(source.splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip") and number not in tables
    ]


def test_fmt_skip_keeps_only_data_tables():
    found = {}
    for path in _modules(*PACKAGES):
        lines = fmt_skips_outside_tables(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"`# fmt: skip` on code, not a data table (let ruff format it): {found}"


def test_the_check_tells_a_table_from_squeezed_code():
    source = "ROWS = [\n    (1, 2),  (3, 4),\n]  # fmt: skip\nx = f(a,\n      b)  # fmt: skip\n"
    assert fmt_skips_outside_tables(source) == [5]
