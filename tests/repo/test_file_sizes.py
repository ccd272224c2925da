"""No module of app, engine or kernels is over 400 lines (issue 28): past that a file holds two
concepts, and the split is cheaper while it is small."""

from __future__ import annotations

from repo_paths import REPO as ROOT

MAX_LINES = 400


def test_no_module_is_over_the_line_limit():
    over = {
        str(path.relative_to(ROOT)): n
        for package in ("app", "engine", "kernels")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"over {MAX_LINES} lines, split by concept: {over}"
