"""A `kvscope serve` Server in a process of its own under a lowered RLIMIT_NOFILE, so that a
test can run it out of file descriptors without touching the test process's own limit.

Usage: fd_limited_server.py MODEL SOFT HARD HEADER_TIMEOUT_S. Prints one JSON line (port, the
soft limit once the server started, the connection budget), then obeys stdin lines: "hog"
opens /dev/null until EMFILE (the process's other files taking every descriptor), "free"
closes them, "fds" counts the descriptors open, "quit" stops the server. Each command answers
one JSON line."""

from __future__ import annotations

import errno
import json
import os
import resource
import sys


def main() -> None:
    model, soft, hard, header_timeout_s = sys.argv[1], *map(int, sys.argv[2:4]), sys.argv[4]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    from kvscope.app.serve.connections import ConnectionLimits
    from kvscope.app.serve.server import Server
    from kvscope.engine import LLM

    llm = LLM(
        model=model,
        device="cpu",
        dtype="float32",
        num_kv_blocks=16,
        block_size=16,
        max_model_len=64,
    )
    limits = ConnectionLimits(header_timeout_s=float(header_timeout_s))
    server = Server(llm, port=0, limits=limits).start()
    budget = server.connection_budget
    say(
        port=server.port,
        fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        cap=budget.cap,
        overflow=budget.overflow,
    )
    hogs: list[int] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "hog":
            try:
                while True:
                    hogs.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE, e
            say(hogged=len(hogs))
        elif command == "free":
            for fd in hogs:
                os.close(fd)
            hogs.clear()
            say(freed=True)
        elif command == "fds":
            say(open=len(os.listdir("/proc/self/fd")) - 1)
        elif command == "quit":
            break
    server.stop()
    say(stopped=True)


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


if __name__ == "__main__":
    main()
