"""llama.cpp's own server as the serve bench's peer: where its binary is, the command line it
runs with, and its process (started on 127.0.0.1, output to a log file, stopped with Ctrl-C).

The command is llama-server as a user would run it for concurrent clients: continuous batching
(on by default), `-np` slots, the same threads as ours for generation and for prompts (`-t`,
`-tb`), prompt caching and the GGUF's own chat template (both on by default), `--metrics` so its
counters land in the report under their own names, and no web UI. With `-np N` and no
`--kv-unified` its context `-c` is split evenly across the slots, so `-c` is N times one
request's need (the prompt, the reply and a margin): the report says both figures.

The binary is built from the llama.cpp sources inside llama-cpp-python's sdist
(app/bench/llama_cpp/build.py, `make peer`); it is an optional benchmark dependency."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvscope.app.bench.llama_cpp.build import server_binary

REPO_CACHE = Path(__file__).resolve().parents[3] / ".cache"  # where `make peer` builds it
BUILD_HINT = "`make peer` (or `python -m kvscope.app.bench.llama_cpp.build --root .cache`)"
SLOTS = 8
CTX_MARGIN = 64  # tokens a slot keeps beyond prompt + reply: llama.cpp's template may differ
CTX_ROUND = 256


class LlamaServerMissing(FileNotFoundError):
    pass


def find_llama_server(given: str | os.PathLike | None = None) -> Path:
    """The binary: `given`, else $KVSCOPE_LLAMA_SERVER, else the repo's `make peer` build, else
    llama-server on PATH; LlamaServerMissing (saying how to build it) when none is there."""
    if given is None:
        given = os.environ.get("KVSCOPE_LLAMA_SERVER")
    if given is not None:
        path = Path(given)
        if not path.is_file():
            raise LlamaServerMissing(
                f"llama-server not found at {path}; build it with {BUILD_HINT}"
            )
        return path
    built = server_binary(REPO_CACHE)
    if built.is_file():
        return built
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    raise LlamaServerMissing(
        f"llama-server not found (looked at {built}, $KVSCOPE_LLAMA_SERVER and PATH); "
        f"build it with {BUILD_HINT}"
    )


def slot_context(prompt_tokens: int, max_tokens: int) -> int:
    """One slot's context: the longest prompt, the reply and a margin, rounded up."""
    need = prompt_tokens + max_tokens + CTX_MARGIN
    return -(-need // CTX_ROUND) * CTX_ROUND


@dataclass(frozen=True)
class LlamaServerSpec:
    binary: Path
    gguf: Path
    threads: int
    slot_ctx: int  # tokens per slot
    slots: int = SLOTS

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.slot_ctx < 16:
            raise ValueError(f"slot_ctx must be >= 16 tokens, got {self.slot_ctx}")

    @property
    def ctx(self) -> int:
        """llama-server's -c: split evenly across the -np slots."""
        return self.slot_ctx * self.slots

    def command(self, port: int) -> list[str]:
        threads = str(self.threads)
        return [
            str(self.binary),
            "-m", str(self.gguf),
            "--host", "127.0.0.1",
            "--port", str(port),
            "-t", threads,
            "-tb", threads,
            "-np", str(self.slots),
            "-c", str(self.ctx),
            "-cb",
            "--metrics",
            "--no-webui",
        ]  # fmt: skip


def llama_server_version(binary: Path) -> str:
    """`llama-server --version`'s line, e.g. "version: 0.5.0-dev (build 1, commit 0c1e570)"."""
    done = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else f"unknown (--version exited {done.returncode})"


def start_logged(cmd: list[str], log: Path) -> subprocess.Popen:
    """`cmd` with its stdout and stderr in `log` (a server's lines must not bury the table)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"
