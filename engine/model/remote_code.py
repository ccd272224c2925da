"""A model folder's own Python code is never run.

Every transformers call that could import code from a model folder (an `auto_map` in
config.json or tokenizer_config.json naming a .py file beside the weights) is made with
`trust_remote_code=False`: transformers then never asks on the terminal, and either loads the
standard class or raises. This turns that refusal into an error that says what happened.
"""

from __future__ import annotations

from pathlib import Path


class RemoteCodeRefused(ValueError):
    """The model folder asks to run code of its own; KVScope never does."""


def refuse_remote_code(error: Exception, folder: Path) -> None:
    """Raise RemoteCodeRefused if `error` is transformers refusing a folder's custom code."""
    text = str(error)
    if "trust_remote_code" in text or "custom code" in text:
        raise RemoteCodeRefused(
            f"{folder}: this model folder asks to run Python code of its own (an auto_map in "
            "config.json or tokenizer_config.json); KVScope never runs a model's code. Use a "
            "folder without it, or a GGUF file in a folder of its own."
        ) from error
