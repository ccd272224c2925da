"""How a child process of ours runs one of our modules with this interpreter.

`python -m` puts the working directory first on the import path. Run from a checkout, that
makes its folders app/, engine/ and kernels/ importable as top-level packages, and kernels/ then
shadows Hugging Face's `kernels` distribution (which transformers imports). `-P` leaves the
working directory off the path.
"""

from __future__ import annotations

import sys

__all__ = ["SAFE_PATH_FLAGS", "python_module_command"]

SAFE_PATH_FLAGS: tuple[str, ...] = ("-P",)


def python_module_command(module: str, *args: str) -> list[str]:
    """`python -P -m module args...` with the interpreter running us."""
    return [sys.executable, *SAFE_PATH_FLAGS, "-m", module, *args]
