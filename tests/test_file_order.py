"""tests/file_order.py: xdist gets the longest files first, and each complete run's figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

from file_order import CACHE_KEY, longest_first

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import file_order

def pytest_configure(config):
    file_order.configure(config)

def pytest_collection_modifyitems(config, items):
    file_order.modify_items(config, items)
"""


def test_longest_first_ranks_by_seconds_then_by_count():
    counts = {"a.py": 40, "b.py": 1, "c.py": 3, "d.py": 3}
    # b: few tests but the slowest; a: unknown, 40 tests at a second each; c and d tie.
    assert longest_first(counts, {"b.py": 90.0, "c.py": 2.0, "d.py": 2.0}) == [
        "b.py",
        "a.py",
        "c.py",
        "d.py",
    ]


def _run(folder: Path, *args: str) -> list[str]:
    """Files in the order one xdist worker ran them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", "-v", "-n", "1", "--dist", "loadfile"]
    out = subprocess.run(
        [*cmd, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    order = []
    for line in out.stdout.splitlines():
        if " PASSED " in line:
            name = line.split("PASSED ")[-1].split("::")[0]
            if name not in order:
                order.append(name)
    return order


def test_the_slowest_file_runs_first_and_complete_runs_are_cached(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    # xdist alone would start with test_many (most tests) and end with test_few.
    many = "\n".join(f"def test_{i}():\n    pass\n" for i in range(5))
    (tmp_path / "test_many.py").write_text(many)
    (tmp_path / "test_few.py").write_text("def test_one():\n    pass\n")
    cache = tmp_path / ".pytest_cache" / "v" / CACHE_KEY
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"test_few.py": 120.0, "test_many.py": 1.0}))
    assert _run(tmp_path) == ["test_few.py", "test_many.py"]
    # The run replaced both figures with what it measured.
    seconds = json.loads(cache.read_text())
    assert set(seconds) == {"test_few.py", "test_many.py"} and seconds["test_few.py"] < 120
    # A part of a file is no figure for the file: a -k run orders by the cache, records nothing.
    cache.write_text(json.dumps({"test_many.py": 77.0}))
    assert _run(tmp_path, "-k", "test_1 or test_one") == ["test_many.py", "test_few.py"]
    assert json.loads(cache.read_text()) == {"test_many.py": 77.0}
