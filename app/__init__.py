"""KVScope's desktop app and command line (the only layer that knows about Qt)."""

import os
import signal
import sys
import threading


def _is_the_cli() -> bool:
    """This process is `kvscope` (the console script) or `python -m kvscope.app.cli`: the
    package is imported first by either, before torch (below) takes its seconds."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "kvscope.app.cli":
        return True
    return os.path.basename(sys.argv[0]).removesuffix(".exe") in ("kvscope", "kvscope-script.py")


def interrupted_while_loading(signum: int, frame: object) -> None:
    os.write(2, b"\ninterrupted\n")
    os._exit(130)  # nothing has started yet; an exception here would print the import's stack


# Ctrl-C while `kvscope` still imports (torch, transformers: seconds) ends it with one line and
# status 130, not a KeyboardInterrupt traceback; app/cli/main.py's main() takes SIGINT back.
if (
    _is_the_cli()
    and threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, interrupted_while_loading)

# Before any module of ours loads torch: the engine package bounds OpenMP's idle spinning first
# (engine/omp_spin.py).
from kvscope import engine  # noqa: E402, F401
