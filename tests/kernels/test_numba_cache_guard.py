"""Two processes compiling into one cold numba cache at once (kernels/numba_cache_guard.py).

Each child compiles one signature of a cached function; numba's index and data writes are held
back so that both have read the empty index before either writes it, and so that the last index
and the last code written come from different processes: the moments a real race needs luck to
hit. A third process then loads both signatures from the cache. Unguarded, numba files the two
under one data file, and the third process runs one signature's machine code for the other (here
harmlessly: float code for an int argument, so the result comes back a float; with arrays it is
a segfault). Guarded, each signature keeps its own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("numba")

MODULE = """
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1
"""

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    folder, guarded, role = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    os.environ["NUMBA_CACHE_DIR"] = str(folder / "cache")
    sys.path.insert(0, str(folder))
    from numba.core import caching

    save_index = caching.IndexDataCacheFile._save_index
    save_data = caching.IndexDataCacheFile._save_data

    # Both writers have read the index by 1.5 s. The int writer's index lands last and the float
    # writer's code after it: the order a race leaves when one process pickles its code slower.
    def slow_save_index(self, overloads):
        time.sleep(2.0 if role == "int" else 1.5)
        save_index(self, overloads)

    def slow_save_data(self, name, data):
        time.sleep(1.5 if role == "float" else 0.0)
        save_data(self, name, data)

    caching.IndexDataCacheFile._save_index = slow_save_index
    caching.IndexDataCacheFile._save_data = slow_save_data
    import racing
    if guarded:
        from kvscope.kernels import numba_cache_guard
        numba_cache_guard.guard(racing, folder / "cache")
    if role == "reader":
        results = [racing.plus_one(2), racing.plus_one(2.0)]
        hits = sum(racing.plus_one.stats.cache_hits.values())
        print(json.dumps({"types": [type(r).__name__ for r in results], "hits": hits}))
    else:
        (folder / f"ready-{role}").touch()
        while not (folder / "go").exists():
            time.sleep(0.01)
        racing.plus_one(2 if role == "int" else 2.0)
    """
)


def _child(folder: Path, guarded: bool, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), "1" if guarded else "0", role],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _race_then_read(folder: Path, guarded: bool) -> dict:
    (folder / "racing.py").write_text(MODULE, encoding="utf-8")
    writers = [_child(folder, guarded, role) for role in ("int", "float")]
    deadline = time.monotonic() + 120
    while not all((folder / f"ready-{role}").exists() for role in ("int", "float")):
        assert time.monotonic() < deadline, "the writers never got ready"
        assert all(w.poll() is None for w in writers), writers[0].communicate()
        time.sleep(0.02)
    (folder / "go").touch()
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
    reader = _child(folder, guarded, "reader")
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    return json.loads(out)


def test_unguarded_numba_files_two_signatures_under_one_data_file(tmp_path: Path) -> None:
    """The premise: without the guard this set-up does mislabel an entry (else the guarded
    test below would pass without proving anything)."""
    read = _race_then_read(tmp_path, guarded=False)
    assert read["types"] != ["int", "float"]
    assert len(list((tmp_path / "cache").rglob("*.nbc"))) == 1


def test_guarded_processes_keep_each_signature_s_own_code(tmp_path: Path) -> None:
    read = _race_then_read(tmp_path, guarded=True)
    assert read == {"types": ["int", "float"], "hits": 2}  # both loaded, neither recompiled
    assert len(list((tmp_path / "cache").rglob("*.nbc"))) == 2


def test_a_mislabelled_entry_is_recompiled_not_run(tmp_path: Path) -> None:
    """A cache an unguarded race left behind (as one written before the guard may be)."""
    _race_then_read(tmp_path, guarded=False)
    reader = _child(tmp_path, True, "reader")
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    assert json.loads(out)["types"] == ["int", "float"]
    assert "recompiling" in err


def test_the_cpu_kernels_load_through_the_guard() -> None:
    from numba.core.dispatcher import Dispatcher

    from kvscope.kernels import cpu_decode, cpu_decode_jit, cpu_dequant_jit, cpu_gemv_jit
    from kvscope.kernels.numba_cache_guard import GuardedFunctionCache

    assert cpu_decode.load() is not None
    for module in (cpu_gemv_jit, cpu_dequant_jit, cpu_decode_jit):
        kernels = [
            v
            for v in vars(module).values()
            if isinstance(v, Dispatcher) and v.__module__ == module.__name__
        ]
        assert kernels, module.__name__
        unguarded = [k for k in kernels if not isinstance(k._cache, GuardedFunctionCache)]
        assert not unguarded, unguarded


def test_a_lock_file_that_cannot_be_made_costs_the_cache_not_the_call(tmp_path: Path) -> None:
    """Where the lock cannot be taken (here a folder sits at its path), the kernels still run:
    compiled, not loaded, and not saved."""
    from kvscope.kernels.numba_cache_guard import LOCK_NAME

    (tmp_path / "racing.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "cache" / LOCK_NAME).mkdir(parents=True)
    script = textwrap.dedent(
        """
        import os, sys
        from pathlib import Path
        folder = Path(sys.argv[1])
        os.environ["NUMBA_CACHE_DIR"] = str(folder / "cache")
        sys.path.insert(0, str(folder))
        import racing
        from kvscope.kernels import numba_cache_guard
        numba_cache_guard.guard(racing, folder / "cache")
        print(racing.plus_one(2), racing.plus_one(2.5))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "3.5"]
    assert "cannot be read" in done.stderr and "cannot be written" in done.stderr
    assert not list((tmp_path / "cache").rglob("*.nbc"))
