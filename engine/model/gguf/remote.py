"""A GGUF model sized from its headers alone, read through ranged reads (a file on a hub).

Before a user downloads gigabytes, the hub search says whether the file fits this machine. That
takes what the engine itself sizes a model by: the ModelConfig (`gguf_config`) and every weight
tensor's shape and stored type (`GGUFSource`), all of them in the header (`read_gguf_header`),
plus the few bytes of a llama3 `rope_freqs` tensor the config needs. A split GGUF
(`-00001-of-00003.gguf`) keeps the metadata in its first part and lists each part's tensors in
that part's own header, so every part's header is read. A file the engine could size but not run
(a tensor type it lacks) says why in `problem` rather than raising: the search shows it with its
figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

from kvscope.engine.model.gguf.file import GGUFBytes, GGUFFile, GGUFTensor, read_gguf_header
from kvscope.engine.model.gguf.identity import quantization_label
from kvscope.engine.model.gguf.loader import (
    ROPE_FREQS,
    GGUFSource,
    check_tensor_types,
    gguf_config,
)
from kvscope.engine.model.model_config import ModelConfig

__all__ = ["GGUFBytes", "RemoteGGUF", "read_remote_gguf"]

SPLIT_COUNT_KEY = "split.count"
SPLIT_TENSORS_KEY = "split.tensors.count"


@dataclass(frozen=True)
class RemoteGGUF:
    config: ModelConfig
    shapes: dict[str, tuple[int, ...]]  # every weight tensor under its HF name
    kinds: dict[str, str]  # their stored types ("Q4_K", "F32"), as GGUFSource.kinds
    quantization: str  # "Q4_K_M": the file's own type, else its layers' dominant one
    header_bytes: int  # of every part, up to where its tensor data starts
    problem: str | None  # why the engine cannot run the file as it is; None when it can


def read_remote_gguf(parts: Sequence[GGUFBytes], name: str) -> RemoteGGUF:
    """The model in `parts` (one file, or a split file's parts in order), from their headers.
    Raises ValueError, naming `name`, for a file the engine cannot even size (not GGUF, an
    unsupported architecture, a header that contradicts itself)."""
    if not parts:
        raise ValueError(f"{name}: no file to read")
    headers = [read_gguf_header(part, name) for part in parts]
    first = headers[0]
    declared = first.metadata.get(SPLIT_COUNT_KEY, 1)
    if declared != len(parts):
        raise ValueError(f"{name}: the header says {declared} parts, {len(parts)} were given")
    tensors = [
        _with_rope_freqs(t, part, header)
        for part, header in zip(parts, headers, strict=True)
        for t in header.tensors
    ]
    listed = first.metadata.get(SPLIT_TENSORS_KEY, len(tensors))
    if listed != len(tensors):
        raise ValueError(f"{name}: the parts list {len(tensors)} tensors, the header says {listed}")
    # Offsets point into different parts: only the tensor list as a whole is used from here.
    whole = replace(first, path=Path(name), tensors=tensors)
    config = gguf_config(whole)
    source = GGUFSource(whole, {})
    shapes, kinds = source.shapes(), source.kinds()
    label, _ = quantization_label(first.metadata, shapes, kinds)
    header_bytes = sum(h.data_offset for h in headers)
    return RemoteGGUF(config, shapes, kinds, label, header_bytes, _problem(whole))


def _with_rope_freqs(tensor: GGUFTensor, part: GGUFBytes, header: GGUFFile) -> GGUFTensor:
    """The tensor, with its data read when the config needs it (llama3's rope_freqs: a few
    hundred bytes); every other tensor's data stays unread."""
    if tensor.name != ROPE_FREQS or tensor.qtype != GGMLQuantizationType.F32:
        return tensor  # gguf_config refuses a rope_freqs of another type, naming it
    raw = part[tensor.offset : tensor.offset + tensor.nbytes]
    if len(raw) != tensor.nbytes:
        raise ValueError(f"{header.path}: {ROPE_FREQS} is cut short ({len(raw)} bytes)")
    return replace(tensor, data=np.frombuffer(raw, np.dtype("<f4")))


def _problem(whole: GGUFFile) -> str | None:
    try:
        check_tensor_types(whole)
    except ValueError as e:
        return str(e)
    return None
