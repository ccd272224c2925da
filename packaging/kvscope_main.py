"""Entry script of the frozen app (packaging/kvscope.spec): the same `kvscope` command as pip's."""

from __future__ import annotations

import multiprocessing
import os
import sys


def _prepare_frozen_runtime() -> None:
    # An installed app never reaches the network: the model and tokenizer ship inside it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # A windowed Windows build has no console: stdout/stderr are None, and anything that prints
    # (tqdm, warnings, logging's last-resort handler) would raise. Send them nowhere instead.
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115


def main() -> int:
    multiprocessing.freeze_support()
    if getattr(sys, "frozen", False):
        _prepare_frozen_runtime()
    # The app's background compile of the CPU kernels runs this executable again with this flag
    # (engine/cpu_kernels.compile_command): there is no `python -m` in a bundle.
    if sys.argv[1:2] == ["--compile-cpu-kernels"]:
        from kvscope.engine.cpu_kernels import main as compile_main

        return compile_main(["--compile", *sys.argv[2:]])
    from kvscope.app.cli.main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
