"""A repo's tree as the search lists it: one entry per model, with its quant, parts and bytes.

Quantizers name files after llama.cpp's recipes: `Llama-3.2-1B-Instruct-Q4_K_M.gguf`,
`qwen2.5-0.5b-instruct-q8_0.gguf`, `mistral-7b-instruct-v0.2.Q4_K_M.gguf`,
`Mistral-7B-Instruct-v0.3.fp16.gguf`. llama.cpp's gguf-split names the parts of a large file
`<stem>-00001-of-00003.gguf`; they are one model, listed once. Vision projectors
(`mmproj-*.gguf`) and importance matrices are GGUF files but not models, so they are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
# One dash- or dot-separated piece of a name: Q4_K_M, IQ4_XS, Q8_0, Q4_0_4_4, F16, BF16, ...
_QUANT_PIECE = re.compile(
    r"^(?:UD_)?(?:I?Q[1-8](?:_[0-9A-Z]+)+|TQ[12]_0|MXFP4|B?F16|F32|FP16|FP32)$"
)
_FLOAT_NAMES = {"FP16": "F16", "FP32": "F32"}
NOT_MODEL_MARKERS = ("mmproj", "imatrix")


@dataclass(frozen=True)
class TreeFile:
    """One file of a repo's tree: its path, bytes and the hub's LFS sha256 (None if not LFS)."""

    path: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class ModelFiles:
    """One model: a single GGUF file, or the parts of a split one in order."""

    parts: tuple[TreeFile, ...]

    @property
    def path(self) -> str:
        return self.parts[0].path

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)


def quant_of(file_name: str) -> str | None:
    """The quant a file name states ("Q4_K_M", "IQ4_XS", "F16"), upper case; None if none."""
    stem = PurePosixPath(file_name).name
    split = SPLIT_PART.match(stem)
    stem = split.group("stem") if split else re.sub(r"\.gguf$", "", stem, flags=re.I)
    # unsloth's dynamic quants read "UD-Q4_K_XL": joined here, so the dash does not split them
    pieces = re.split(r"[-.]", re.sub(r"(?<![A-Z0-9])UD-", "UD_", stem.upper()))
    for piece in reversed(pieces):  # the quant comes last; a model name may hold a Q-like word
        if _QUANT_PIECE.match(piece):
            return _FLOAT_NAMES.get(piece, piece.replace("UD_", "UD-"))
    return None


def is_model_gguf(path: str) -> bool:
    name = PurePosixPath(path).name.lower()
    return name.endswith(".gguf") and not any(marker in name for marker in NOT_MODEL_MARKERS)


def model_files(tree: list[TreeFile]) -> list[ModelFiles]:
    """The repo's models, in path order: split parts joined under their first part; a split
    file missing a part is left out (it cannot be pulled whole)."""
    models: list[ModelFiles] = []
    splits: dict[tuple[str, int], dict[int, TreeFile]] = {}
    for entry in tree:
        if not is_model_gguf(entry.path):
            continue
        match = SPLIT_PART.match(entry.path)
        if match is None:
            models.append(ModelFiles((entry,)))
            continue
        key = (match.group("stem"), int(match.group("count")))
        splits.setdefault(key, {})[int(match.group("number"))] = entry
    for (_, count), numbered in splits.items():
        if sorted(numbered) == list(range(1, count + 1)):
            models.append(ModelFiles(tuple(numbered[n] for n in range(1, count + 1))))
    return sorted(models, key=lambda model: model.path)
