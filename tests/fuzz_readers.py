"""One fuzz harness for every file reader (issue 43): recordings and traces, settings, the chat
database, GGUF headers, workloads.

A reader is a function of a path and the exceptions its callers catch and show (`Reader`). Its
test file hands this module valid seed files; hypothesis mutates them (`mutations`: bit flips,
truncations, splices, huge, negative and non-finite numbers, deep nesting, NUL runs, repeated
lines) and every input must end in one of those exceptions, with a short message, or in a
result, within `TIME_LIMIT_S`. The saved corpus (tests/fuzz_corpus/<reader>/, a few KB a file)
holds the seeds and the known hostile cases, each run under tracemalloc within `MEMORY_LIMIT`;
`hostile_paths` adds those too big or too odd to check in (a 1 GB sparse file of NUL bytes, a
symlink to /dev/zero, a FIFO, a folder). `make test` runs it all in well under a minute;
KVSCOPE_FUZZ_SCALE=N runs N times the examples for a longer hunt.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from repo_paths import TESTS

CORPUS = TESTS / "fuzz_corpus"
TIME_LIMIT_S = 2.0  # per input, on a loaded 2-core machine
MEMORY_LIMIT = 300 << 20  # peak Python and numpy allocations per input (tracemalloc)
MAX_MESSAGE_CHARS = 2000  # an error a person reads: never a dump of the input
SCALE = max(1, int(os.environ.get("KVSCOPE_FUZZ_SCALE", "1")))
SPARSE_BYTES = 1 << 30  # the 1 GB NUL file: sparse, so it takes no disk

# What a number in a text file becomes: bounds, their neighbours, non-finite and huge values.
NUMBERS = [
    b"0",
    b"-1",
    b"-0.0",
    b"0.5",
    b"2147483648",
    b"4294967296",
    b"16777217",
    b"100000000",
    b"9223372036854775808",
    b"18446744073709551616",
    b"1" + b"0" * 400,
    b"9" * 4500,
    b"1e308",
    b"-1e308",
    b"1e-320",
    b"1e999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"true",
    b"null",
    b'"7"',
    b"[]",
    b"{}",
]
# What a binary length or count field becomes (little-endian, 4 or 8 bytes).
WORDS = [0, 1, 0x7F, 0xFF, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
OPS = ("flip", "truncate", "splice", "delete", "number", "word", "nest", "nul", "dup_line", "junk")


@dataclass(frozen=True)
class Reader:
    """A file reader as its callers use it: `read(path)` reads the whole file (a generator is
    drained), `errors` are the exceptions they catch and show, the seed files' suffix."""

    name: str
    read: Callable[[Path], object]
    errors: tuple[type[BaseException], ...]
    suffix: str

    @property
    def corpus(self) -> Path:
        return CORPUS / self.name

    def seeds(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.corpus.glob("seed*"))]


def mutate(data: bytes, op: str, a: int, b: int, c: int, extra: bytes) -> bytes:
    """`data` after one mutation; a, b, c are positions or choices, taken modulo what fits."""
    n = len(data)
    if n == 0:
        return extra
    i, j = a % n, b % n
    if op == "flip":
        out = bytearray(data)
        out[i] ^= 1 << (c % 8)
        return bytes(out)
    if op == "truncate":
        return data[:i]
    if op == "splice":  # a slice copied in elsewhere (a line's fields, a header's records)
        piece = data[i : i + 1 + c % 256]
        return data[:j] + piece + data[j:]
    if op == "delete":
        return data[:i] + data[i + 1 + c % 256 :]
    if op == "number":  # one number in the text becomes a hostile one
        found = list(_NUMBER.finditer(data))
        if not found:
            return data
        m = found[a % len(found)]
        return data[: m.start()] + NUMBERS[b % len(NUMBERS)] + data[m.end() :]
    if op == "word":  # a binary count, length or type overwritten
        width = 4 if c % 2 else 8
        word = WORDS[b % len(WORDS)].to_bytes(8, "little")[:width]
        return data[:i] + word + data[i + width :]
    if op == "nest":  # deeper than any parser recurses
        depth = (5, 1000, 100_000)[c % 3]
        opener = b"[" if b % 2 else b'{"a":'
        return data[:i] + opener * depth + data[i:]
    if op == "nul":
        return data[:i] + b"\0" * (1 + c % 4096) + data[i:]
    if op == "dup_line":
        lines = data.split(b"\n")
        k = a % len(lines)
        return b"\n".join(lines[: k + 1] + [lines[k]] * (1 + c % 3) + lines[k + 1 :])
    assert op == "junk"
    return data[:i] + extra + data[i:]


@st.composite
def mutations(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A hostile variant of one of `seeds`: one to three mutations in a row."""
    data = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(OPS))
        a, b, c = (draw(st.integers(0, 1 << 30)) for _ in range(3))
        extra = draw(st.binary(max_size=16)) if op == "junk" else b""
        data = mutate(data, op, a, b, c, extra)
    return data


def check_input(reader: Reader, path: Path) -> BaseException | None:
    """Read `path` once: it returns, or raises one of `reader.errors` with a short message,
    within TIME_LIMIT_S; anything else propagates (the fuzzer's finding). The error, or None."""
    start = time.perf_counter()
    error: BaseException | None = None
    try:
        reader.read(path)
    except reader.errors as e:
        error = e
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_LIMIT_S, f"{reader.name} took {elapsed:.2f} s on {path}"
    if error is not None:
        assert 0 < len(str(error)) < MAX_MESSAGE_CHARS, f"{reader.name}: {str(error)[:3000]!r}"
    return error


def check_bounded(reader: Reader, path: Path) -> tuple[BaseException | None, int]:
    """`check_input` under tracemalloc: (the error or None, peak bytes), within MEMORY_LIMIT."""
    tracemalloc.start()
    try:
        error = check_input(reader, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"{reader.name} took {peak / 2**20:.0f} MiB on {path}"
    return error, peak


def check_corpus(reader: Reader, folder: Path) -> dict[str, int]:
    """Every saved case, copied into `folder` (a reader may move a damaged file aside), within
    the time and memory limits: a seed (`seed*`) and a hostile case that must still read
    (`ok_*`: one that once crashed a reader) read; any other file is refused with one of the
    errors. {file name: peak bytes}."""
    cases = sorted(p for p in reader.corpus.iterdir() if p.is_file())
    assert any(p.name.startswith("seed") for p in cases), f"no seed in {reader.corpus}"
    peaks = {}
    for case in cases:
        path = folder / case.name
        shutil.copyfile(case, path)
        error, peaks[case.name] = check_bounded(reader, path)
        if case.name.startswith(("seed", "ok_")):
            assert error is None, f"{path}: {error}"
        else:
            assert error is not None, f"{path} was accepted; it is kept as a refused case"
    return peaks


def hostile_paths(folder: Path, suffix: str, special: bool = True) -> dict[str, Path]:
    """Paths no corpus can hold: a 1 GB sparse file of NUL bytes, a symlink to /dev/zero
    and a FIFO (`special`), a folder, a dangling symlink, an empty file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}{suffix}" for name in ("nul", "empty", "folder", "dangling")}
    with open(paths["nul"], "wb") as f:
        f.truncate(SPARSE_BYTES)
    paths["empty"].write_bytes(b"")
    paths["folder"].mkdir()
    paths["dangling"].symlink_to(folder / "nowhere")
    if special and os.path.exists("/dev/zero"):
        paths["zero"] = folder / f"zero{suffix}"
        paths["zero"].symlink_to("/dev/zero")
    if special and hasattr(os, "mkfifo"):
        paths["fifo"] = folder / f"fifo{suffix}"
        os.mkfifo(paths["fifo"])
    return paths


# What every reader says of a path that is no file at all (engine/input_file.py's words).
NOT_A_FILE = {
    "zero": "is a link to /dev/zero, which is a character device, not a regular file",
    "fifo": "is a pipe (FIFO), not a regular file",
    "folder": "is a folder, not a regular file",
}
UNREAD_LIMIT = 16 << 20  # a refused hostile path: its first bytes at most, never its gigabyte


def check_refused_path(reader: Reader, folder: Path, name: str, own: dict[str, str]) -> None:
    """The hostile path `name` (`hostile_paths`) is refused before it is read: an error whose
    message holds `own[name]`, or NOT_A_FILE's words, within UNREAD_LIMIT."""
    paths = hostile_paths(folder, reader.suffix)
    if name not in paths:
        pytest.skip(f"no {name} on this system")
    error, peak = check_bounded(reader, paths[name])
    assert error is not None, f"{reader.name} read {name}"
    assert peak < UNREAD_LIMIT, peak
    expected = {**NOT_A_FILE, **own}[name]
    assert expected in str(error), error


def fuzz(reader: Reader, folder: Path, examples: int) -> None:
    """`examples` (times KVSCOPE_FUZZ_SCALE) mutated seeds through `check_input`."""
    path = folder / f"fuzzed{reader.suffix}"

    @settings(
        max_examples=examples * SCALE,
        deadline=None,  # TIME_LIMIT_S is checked around the read alone
        database=None,
        # `make test` runs the same inputs every time (a CI run that fails names a real bug,
        # reproducibly); a longer hunt (KVSCOPE_FUZZ_SCALE > 1) draws new ones.
        derandomize=SCALE == 1,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutations(reader.seeds()))
    def one(data: bytes) -> None:
        path.write_bytes(data)
        check_input(reader, path)

    one()
