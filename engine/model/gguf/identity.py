"""What a GGUF file says it is, from its header alone: GGUF or not, its quantization, its names.

A picker that labels a file from a guess misleads: a Gemma 3 270M Q4_K_M file keeps its large
embedding in Q8_0, so "the type holding the most elements" called it Q8_0. The label here is the
file's own `general.file_type` (llama.cpp writes it from the chosen recipe); only a file without
one falls back to the type most of its layer matrices are stored in, and says so. Ollama keeps
GGUF files under hash names with no suffix, so a file is GGUF by its magic bytes, not its name.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from gguf import LlamaFileType

__all__ = ["is_gguf_file"]

MAGIC = b"GGUF"
GUESSED_BIT = int(LlamaFileType.GUESSED)  # llama.cpp's "not from the file" flag: never trusted
# The metadata fields that name a model (llama.cpp's converter fills them from the repo name).
NAME_KEYS = ("general.name", "general.basename", "general.finetune", "general.type")


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """A .gguf file, or any file that starts with the GGUF magic (an Ollama blob)."""
    path = Path(path)
    try:
        if not path.is_file():
            return False
        if path.suffix.lower() == ".gguf":
            return True
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def file_type_label(metadata: Mapping[str, object]) -> str:
    """`general.file_type` as llama.cpp names it ("Q4_K_M", "F16"); "" when absent or unknown."""
    value = metadata.get("general.file_type")
    if not isinstance(value, int) or isinstance(value, bool) or value & GUESSED_BIT:
        return ""
    try:
        name = LlamaFileType(value).name
    except ValueError:  # a type newer than this gguf-py
        return ""
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def dominant_layer_type(shapes: Mapping[str, tuple[int, ...]], kinds: Mapping[str, str]) -> str:
    """The storage type holding most elements of the layer matrices (not the embedding or
    the head, which llama.cpp's recipes keep at another type, nor the F32 norms)."""
    elements: Counter[str] = Counter()
    for name, kind in kinds.items():
        shape = shapes.get(name, ())
        if ".layers." not in name or len(shape) != 2:
            continue
        elements[str(kind)] += int(shape[0]) * int(shape[1])
    if not elements:  # no layer matrices under HF names: every 2-D tensor
        for name, kind in kinds.items():
            shape = shapes.get(name, ())
            if len(shape) == 2:
                elements[str(kind)] += int(shape[0]) * int(shape[1])
    return elements.most_common(1)[0][0] if elements else ""


def quantization_label(
    metadata: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]], kinds: Mapping[str, str]
) -> tuple[str, str]:
    """(label, where it came from): the file's own type, else its layers' dominant type."""
    own = file_type_label(metadata)
    if own:
        return own, f"general.file_type {metadata['general.file_type']} ({own})"
    dominant = dominant_layer_type(shapes, kinds)
    if dominant:
        return dominant, f"no general.file_type: most layer weights are {dominant}"
    return "", "no general.file_type and no weight matrices"


def name_fields(metadata: Mapping[str, object]) -> dict[str, str]:
    """The naming fields the file has, as strings (general.name, basename, finetune, type)."""
    return {k: str(metadata[k]) for k in NAME_KEYS if isinstance(metadata.get(k), (str, int))}
