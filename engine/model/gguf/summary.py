"""What the model picker shows of a GGUF file, from its header alone: name and quantization.

The app lists every GGUF in a user's folders (LM Studio, Ollama's blobs, Recent) and must not
load any to do it; this reads the header, checks that the engine could size the model (a file
it cannot is refused here, in the picker, rather than at load), and labels it by the file's own
type (engine/model/gguf/identity.py). Kept apart from gguf_identity, which the loader imports:
this module needs the loader's config reader and tensor shapes, so it sits above both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.engine.model.gguf.identity import name_fields, quantization_label
from kvscope.engine.model.gguf.loader import GGUFSource, gguf_config
from kvscope.engine.model.gguf.split import read_gguf_model

__all__ = ["GGUFSummary", "summarize_gguf"]


@dataclass(frozen=True)
class GGUFSummary:
    name: str  # general.name, else the file's name
    quantization: str  # "Q4_K_M": the file's own type, else its layers' dominant one
    why: str  # where that label came from, for the tooltip
    names: dict[str, str] = field(default_factory=dict)  # general.name, basename, finetune, type


def summarize_gguf(path: str | os.PathLike[str]) -> GGUFSummary:
    """The header's summary; raises whatever a damaged or unsupported file raises."""
    gguf_file = read_gguf_model(path)
    gguf_config(gguf_file)  # a file the engine cannot size says why here, not at load
    source = GGUFSource(gguf_file, {})
    label, why = quantization_label(gguf_file.metadata, source.shapes(), source.kinds())
    names = name_fields(gguf_file.metadata)
    return GGUFSummary(names.get("general.name") or Path(path).name, label, why, names)
