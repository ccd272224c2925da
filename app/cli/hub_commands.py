"""`kvscope pull REPO[:QUANT]`: models from the Hugging Face Hub, from the command line.

Progress goes to stderr (one updating line on a terminal, a line per change of state otherwise);
the last line on stdout is the model's local path, so `$(kvscope pull org/name)` is the file.
huggingface_hub's environment applies: HF_ENDPOINT (a mirror), HF_TOKEN, HF_HOME/HF_HUB_CACHE,
HF_HUB_OFFLINE, and the usual HTTPS_PROXY.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # the CLI starts without importing huggingface_hub unless it pulls
    from kvscope.app.core.hub.pull import PullProgress

_TERMINAL_EVERY_S = 0.2
_LOG_EVERY_S = 10.0


def add_pull_parser(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser(
        "pull",
        help="download a GGUF model from the Hugging Face Hub into its cache (resumable, verified)",
    )
    pull.add_argument(
        "model",
        metavar="REPO[:QUANT]",
        help="e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M; without a quant, Q4_K_M, then "
        "Q8_0 (as llama.cpp's -hf)",
    )
    pull.add_argument(
        "--file",
        default=None,
        metavar="NAME",
        help="this file of the repo instead of a quant (all parts of a split model come)",
    )
    pull.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="reconnect when no byte arrived for this long (default 30)",
    )


def run_pull(args: argparse.Namespace) -> int:
    from kvscope.app.core.hub.http_range import RetryPolicy
    from kvscope.app.core.hub.pull import Pull, PullError, parse_repo_spec

    show = ProgressPrinter(sys.stderr)
    try:
        repo, quant = parse_repo_spec(args.model)
        job = Pull(
            repo,
            quant,
            args.file,
            on_progress=show,
            policy=RetryPolicy(stall_timeout_s=args.stall_timeout),
        )
        path = job.run()
    except PullError as error:
        show.end()
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        show.end()
        print(
            "interrupted: the bytes so far are kept; run the same command again to resume.",
            file=sys.stderr,
        )
        return 130
    show.end()
    print(path)
    return 0


class ProgressPrinter:
    """PullProgress as text: an updating line on a terminal, a few plain lines in a log."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._terminal = stream.isatty()
        self._last_state = ""
        self._last_time = 0.0
        self._open_line = False

    def __call__(self, progress: PullProgress) -> None:
        now = time.monotonic()
        changed = progress.state != self._last_state or bool(progress.note)
        every = _TERMINAL_EVERY_S if self._terminal else _LOG_EVERY_S
        if not changed and now - self._last_time < every:
            return
        self._last_state, self._last_time = progress.state, now
        line = describe(progress)
        if self._terminal:
            self._stream.write("\r\x1b[K" + line)
            self._open_line = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def end(self) -> None:
        if self._open_line:
            self._stream.write("\n")
            self._open_line = False


def describe(progress: PullProgress) -> str:
    """`Model-Q4_K_M.gguf  1.20/4.07 GiB  29%  85.3 MiB/s  ETA 34 s  downloading`."""
    parts = [progress.file or progress.repo]
    if progress.total_bytes:
        share = 100 * progress.done_bytes / progress.total_bytes
        parts.append(f"{_size(progress.done_bytes)}/{_size(progress.total_bytes)}  {share:.0f}%")
    if progress.state == "downloading" and progress.bytes_per_s > 0:
        parts.append(f"{_size(int(progress.bytes_per_s))}/s")
        if progress.eta_s is not None:
            parts.append(f"ETA {_duration(progress.eta_s)}")
    parts.append(progress.state + (f": {progress.note}" if progress.note else ""))
    return "  ".join(parts)


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
