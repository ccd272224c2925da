"""A model stored as one GGUF file or split into parts, read as one GGUFFile.

llama.cpp's gguf-split (and the converter's --split-max-tensors) writes a big model as
`<stem>-00001-of-0000N.gguf`, …: every part is a whole GGUF file whose header lists its own
tensors (offsets into its own data), the first part alone carries the model's metadata, and each
says `split.no`, `split.count` and `split.tensors.count`. Hubs publish large quants this way, and
LM Studio and llama.cpp load them from the first part, so we do too: given any part, the parts
beside it are read and their tensors joined, each tensor keeping the file its bytes are in.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from kvscope.engine.model.gguf.file import GGUFFile, read_gguf

__all__ = ["SPLIT_PART", "read_gguf_model", "split_part_number"]

SPLIT_NO_KEY = "split.no"
SPLIT_COUNT_KEY = "split.count"
SPLIT_TENSORS_KEY = "split.tensors.count"
# llama.cpp's split_path format: "%s-%05d-of-%05d.gguf".
SPLIT_PART = re.compile(r"(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


def split_part_number(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(part, count) when the name is a split part's, 1-based; None for a plain file's name."""
    match = SPLIT_PART.fullmatch(Path(path).name)
    if match is None or int(match.group("count")) < 2:
        return None
    return int(match.group("number")), int(match.group("count"))


def read_gguf_model(path: str | os.PathLike[str]) -> GGUFFile:
    """The model at `path`: the file itself, or, for a part of a split model, every part joined
    (metadata from the first, tensors from all, in order). Raises FileNotFoundError naming the
    missing parts, ValueError naming a part whose header contradicts the others."""
    path = Path(path)
    numbered = split_part_number(path)
    if numbered is None:
        gguf_file = read_gguf(path)
        declared = gguf_file.metadata.get(SPLIT_COUNT_KEY, 1)
        if declared != 1:
            raise ValueError(
                f"{path}: the header says it is part {gguf_file.metadata.get(SPLIT_NO_KEY, 0) + 1}"
                f" of a model split into {declared}, but the file is not named as a part"
                " (`<name>-00001-of-0000N.gguf`), so the other parts cannot be found"
            )
        return gguf_file
    _, count = numbered
    stem = SPLIT_PART.fullmatch(path.name).group("stem")  # type: ignore[union-attr]
    parts = [path.with_name(f"{stem}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{parts[0]}: a model split into {count} parts; missing beside it: {', '.join(missing)}"
        )
    return _join([read_gguf(p) for p in parts])


def _join(parts: list[GGUFFile]) -> GGUFFile:
    first = parts[0]
    for number, part in enumerate(parts):
        said = (part.metadata.get(SPLIT_NO_KEY), part.metadata.get(SPLIT_COUNT_KEY))
        if said != (number, len(parts)):
            raise ValueError(
                f"{part.path}: its header says part {said[0]} of {said[1]} (0-based), expected"
                f" part {number} of {len(parts)}"
            )
    tensors = [t for part in parts for t in part.tensors]
    listed = first.metadata.get(SPLIT_TENSORS_KEY, len(tensors))
    if listed != len(tensors):
        raise ValueError(
            f"{first.path}: the parts hold {len(tensors)} tensors, the first part's header says"
            f" {listed}"
        )
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError(f"{first.path}: a tensor name appears in more than one part")
    return replace(first, tensors=tensors)
