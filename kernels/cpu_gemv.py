"""Quantized weights x int8-quantized activations on the CPU, compiled with numba (optional).

At decode a quantized matmul on a CPU is bound by reading the weight bytes, and from a few
rows on by the multiplies. torch's one fast kernel (`_weight_int4pack_mm_for_cpu`) reaches ~2.3
GB/s on the 2-core AVX2 development machine at one row; this kernel does it the way llama.cpp
does: activations are rounded to int8 per group (llama.cpp's q8_1), the weight codes are
multiplied with them in integers (vpmaddubsw: kernels/cpu_simd.py) and each group's integer sum
is scaled once. It serves every batch size: prefill chunks too (see engine/quant/cpu_layout.py).

Layout (one matrix, out_features N, in_features K, weight group G, activation group A <= G):

    codes   4-bit: uint8 [C, Nc/16, K/32, 256]; 8-bit: int8 [C, Nc/16, K/A, 16 A], centred
            (code - c, so that |code| <= 128): tiles of 16 columns, each tile's whole K in
            order, the bytes of a tile and group as kernels/cpu_simd.py's instructions take them
    scale   [C, Nc/16, K/G, 16] float32, or uint16 holding float16 bits where every value is
            exactly a float16 (Q4_0, Q4_1, Q5_0, Q8_0: see `HALF_KINDS`)
    low     the same, except where every offset is a fixed multiple of its scale (the
            symmetric formats, `SYMMETRIC_KINDS`): then a float32 m (Q4_0: -8) and the kernels
            compute m * scale, or None where it is 0 (centred 8-bit codes) and they add nothing
                                        w[k, n] = scale * code + low   (c folded into low)

Q4_K and Q5_K (`SUPER_KINDS`) keep their file's parts per column: scale = (uint8 sc [C, Nc/16,
K/G, 16], float16 bits d [C, Nc/16, K/S, 16]), low = (uint8 m, float16 bits dmin (the format's:
-dmin of the file), float32 c), S = SUB_GROUPS * G; the kernels compute d * sc and dmin * m +
c * scale, the float32 operations (so the bits) the layout stored before (kernels/cpu_meta_jit.py):
Q4_K takes 148 bytes per 256 weights where the file holds 144, and float32 ones took 192.

i.e. the matrix transposed and split into C column chunks of Nc columns, each chunk contiguous.
The chunks are what threads share out (numba's prange over chunks); one thread walks them in
turn at no measured cost.

Decode streams every weight from DRAM once per token, so the order of the reads is what counts,
not only their number: a chunk's codes, and separately its scales, are each read strictly in
order, one stream the hardware prefetcher follows (16 byte rows of Nc bytes read side by side,
an earlier layout, were 16 short streams it did not: 16.5 against 8.2 ms for the bundled model's
120 matrices at one row). float16 scales and offsets cut 8 of a Q4 group's 24 bytes per column
to 4, at no cost in exactness where the format's own d and m are float16 (K-quants' d * sc is
not: they keep d and sc apart). A symmetric format keeps its scale alone, as its file does (Q4_0:
18 bytes per 32 weights, Q8_0: 34): m * scale is exact in float32 (m is -8 or 0), so the
products are the ones a stored offset gave (kernels/cpu_simd.py's PINNED), and the kernels read
no more bytes than the file holds, but for codes widened to a byte (Q5_0, Q6_K).

What this layout bought over the int16 loops it replaced is in PERFORMANCE.md ("CPU GEMV").

numba is optional: `load()` returns None where it is missing or fails to compile, and callers
keep their own path. The compiled code is cached on disk (NUMBA_CACHE_DIR, by default under the
app's cache dir, one folder per version of the sources: `cache_dir`) so the JIT cost is paid
once per machine and version.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import platformdirs

from kvscope.kernels.cpu_meta import (
    SUB_GROUPS,
    SUPER_KINDS,
    Offsets,
    Scales,
    check_super_blocks,
    meta_bytes,
    meta_of,
    super_examples,
)

logger = logging.getLogger(__name__)

ACT_GROUP = 32  # activation rounding group (llama.cpp's q8_1), or the weight group if smaller
CHUNK_COLS = 4096  # at most this many columns per chunk
MIN_CHUNKS = 4  # so that up to 4 threads share even a small matrix
LANE = 16  # chunk widths are multiples of one AVX2 vector of int16 (and of a 4-bit tile)
TILE = 16  # columns per tile of codes (cpu_gemv_jit.TILE, kernels/cpu_simd.py)
# Formats whose layout keeps float16 scales: one level of scales, float16 d and m, and a
# centre that makes low exact (4-bit: none; Q5_0 / Q8_0: low = m + c d = 0). Where a matrix's
# stored values are not all float16 after all, its layout keeps float32.
HALF_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")
# Formats whose offsets are a fixed multiple of their scales, w = d (q - c) (Q6_K: d sc (q - 32)):
# the layout keeps no offsets for them (the module doc's `low`), so Q4_0's scales stay float16
# even where -8 d is none (|d| > 8188).
SYMMETRIC_KINDS = ("Q4_0", "Q5_0", "Q8_0", "Q6_K")
_compile_lock = threading.Lock()
COMPLETE_MARKER = "kvscope-compiled.json"  # see cache_complete()


# The numba-compiled modules. A kernel calling one in another module carries a compiled copy of
# it, and numba's cache checks only the caller's own file: kernels/cpu_decode_jit.py's entries
# would outlive an edit of cpu_gemv_jit.py's chunk4 (a new layout read the old way). So the
# cache has one folder per version of these sources.
JIT_SOURCES = (
    # how the cache is written: a folder written before numba_cache_guard may hold an entry
    # that another process mislabelled
    "numba_cache_guard.py",
    "cpu_meta.py",  # SUB_GROUPS, which the kernels compile in
    "cpu_meta_ir.py",
    "cpu_simd.py",
    "cpu_meta_jit.py",
    "cpu_gemv_jit.py",
    "cpu_dequant_jit.py",
    "cpu_decode_jit.py",
)


def sources_key() -> str:
    """A short hash of the jitted sources (see JIT_SOURCES), for numba's cache folder, and of
    the vector IR they were told to emit (kernels/cpu_simd.py: numba's own cache key has the
    CPU, not this choice)."""
    digest = hashlib.sha256(os.environ.get("KVSCOPE_CPU_SIMD", "auto").encode())
    for name in JIT_SOURCES:
        try:
            digest.update((Path(__file__).parent / name).read_bytes())
        except OSError:  # a bundle without the file: numba's cache refuses it anyway
            digest.update(name.encode())
    return digest.hexdigest()[:12]


def cache_dir() -> Path:
    """Where numba keeps compiled code: KVSCOPE_NUMBA_CACHE, else the app's cache dir
    (KVSCOPE_DATA_DIR/cache when set); one folder per version of the kernels' sources."""
    root: str | Path | None = os.environ.get("KVSCOPE_NUMBA_CACHE")
    if not root:
        data = os.environ.get("KVSCOPE_DATA_DIR")
        base = Path(data) / "cache" if data else Path(platformdirs.user_cache_dir("KVScope"))
        root = base / "numba"
    return Path(root) / sources_key()


def chunking(n: int) -> tuple[int, int]:
    """(chunks, columns per chunk) for N output columns: every chunk holds real columns."""
    chunks = max(MIN_CHUNKS, -(-n // CHUNK_COLS)) if n >= MIN_CHUNKS * LANE else 1
    per_chunk = -(-n // chunks)
    width = -(-per_chunk // LANE) * LANE
    return -(-n // width), width  # rounding the width up may leave the last chunk unneeded


def installed() -> bool:
    """Whether numba can be imported, without importing it (for planners: `load` compiles)."""
    try:
        return importlib.util.find_spec("numba") is not None
    except ValueError:  # sys.modules["numba"] is None: imports of it are blocked
        return False


def layout_bytes(n: int, k: int, bits: int, group: int, kind: str | None = None) -> int:
    """Bytes of one [n, k] matrix in this layout: codes, and per group a scale and, except for
    `SYMMETRIC_KINDS`, an offset (float16 for `HALF_KINDS`, float32 otherwise); for
    `SUPER_KINDS` a byte sc and m per group and a float16 d and dmin per super-block."""
    chunks, width = chunking(n)
    columns = chunks * width
    if kind in SUPER_KINDS and k % (SUB_GROUPS * group) == 0:
        return columns * (k * bits // 8 + 2 * (k // group) + 2 * 2 * (k // group // SUB_GROUPS))
    meta = 2 if kind in HALF_KINDS else 4
    arrays = 1 if kind in SYMMETRIC_KINDS else 2
    return columns * k * bits // 8 + arrays * meta * columns * (k // group)


def compiled_before() -> bool:
    """Whether numba's disk cache already holds these kernels (so `load` takes ~1 s, not the
    tens of seconds of a first compile): for a status line, not a promise."""
    where = Path(os.environ.get("NUMBA_CACHE_DIR") or cache_dir())  # as load() sets it
    return any(where.glob("*/cpu_gemv_jit.*.nbi"))


def cache_complete() -> bool:
    """Whether numba's disk cache holds every kernel: engine/cpu_kernels.compile_all writes
    COMPLETE_MARKER into the cache folder once it has compiled them all."""
    where = Path(os.environ.get("NUMBA_CACHE_DIR") or cache_dir())  # as load() sets it
    return (where / COMPLETE_MARKER).is_file()


@functools.cache
def load() -> SimpleNamespace | None:
    """The compiled kernels, or None where numba is missing or cannot compile here.

    Where the disk cache holds every kernel (`cache_complete`), each one loads from it on its
    first call (tens of ms), so a process loads only the variants its model runs; otherwise
    they are all compiled here, not seconds at a time in the middle of a reply."""
    with _compile_lock:
        os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir()))
        try:
            ns = _build()
            if not cache_complete():
                _warm_up(ns)
        except Exception as exc:  # ImportError, or any numba/LLVM failure: keep torch's path
            logger.info("numba CPU kernels unavailable (%s); using torch's", exc)
            return None
        return ns


def _build() -> SimpleNamespace:
    import numba

    from kvscope.kernels import cpu_dequant_jit as dequant
    from kvscope.kernels import cpu_gemv_jit as jit
    from kvscope.kernels import numba_cache_guard

    for module in (jit, dequant):
        numba_cache_guard.guard(module, Path(os.environ["NUMBA_CACHE_DIR"]))

    return SimpleNamespace(
        numba=numba,
        quantize_rows=jit.quantize_rows,
        serial={4: jit.serial4, 8: jit.serial8},
        parallel={4: jit.parallel4, 8: jit.parallel8},
        serial_bf16={4: jit.serial4_bf16, 8: jit.serial8_bf16},
        parallel_bf16={4: jit.parallel4_bf16, 8: jit.parallel8_bf16},
        dequantize={4: jit.dequantize4, 8: jit.dequantize8},
        dequantize_bf16={4: dequant.dequantize4_bf16, 8: dequant.dequantize8_bf16},
        dequantize_bf16_parallel={
            4: dequant.dequantize4_bf16_parallel,
            8: dequant.dequantize8_bf16_parallel,
        },
    )


def _warm_up(ns: SimpleNamespace) -> None:
    """Compile (or load from the disk cache) the kernels this process will call, on a tiny
    matrix: the parallel entries only where torch runs more than one thread (numba compiles
    them on first use otherwise, which would stall that call by seconds)."""
    import torch  # only to read the engine's thread count; torch is imported already

    x = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    thread_counts = (1, 2) if torch.get_num_threads() > 1 else (1,)
    for code_bits in (4, 8):
        chunks = 2  # the parallel entries run only on more than one chunk
        if code_bits == 4:
            codes = np.zeros((chunks, 1, 2, 256), np.uint8)
        else:
            codes = np.zeros((chunks, 1, 2, TILE * 32), np.int8)
        for scale, low in meta_examples(code_bits, (chunks, 1, 2, TILE)):
            w = QuantizedCodesT(codes, scale, low, 32, code_bits)
            for threads in thread_counts:
                matmul(ns, w, x, threads)
                matmul_bf16(ns, w, bits, threads)
                dequantize_bf16(ns, w, threads)


def meta_examples(bits: int, shape: tuple[int, ...]) -> list[tuple[Scales, Offsets]]:
    """(scale, low) of [C, Nc/16, K/G, 16], zeros, in each pair of types the layouts of
    `bits`-bit codes take (engine/quant/cpu_gemv_layout.py), for the warm-ups: numba compiles a
    kernel once per pair."""
    single, half = np.zeros(shape, np.float32), np.zeros(shape, np.uint16)
    # int4/8 and K-quants whose d is no float16; Q4_K, Q5_K
    pairs: list[tuple[Scales, Offsets]] = [(single, single.copy()), super_examples(shape)]
    if bits == 4:
        pairs += [(half, half.copy()), (half, np.float32(-8))]  # Q4_1; Q4_0
    else:
        pairs += [(half, None), (single, None)]  # Q5_0, Q8_0; Q6_K
    return pairs


def _check_meta(scale: np.ndarray, low: Offsets, codes: tuple[int, ...]) -> None:
    """Raises ValueError unless scale and low are arrays of groups of codes of shape `codes`,
    or low a multiplier or None (the module doc)."""
    fits = scale.ndim == 4 and scale.shape[:2] == codes[:2] and scale.shape[3] == TILE
    if isinstance(low, np.ndarray):
        fits = fits and scale.shape == low.shape and scale.dtype == low.dtype
    elif low is not None and not isinstance(low, np.float32):
        raise ValueError(f"low must be an array, a float32 multiplier or None, not {low!r}")
    if not fits:
        shape = low.shape if isinstance(low, np.ndarray) else low
        raise ValueError(f"scale {scale.shape} and low {shape} do not fit {codes}")
    if scale.dtype not in (np.float32, np.uint16):
        raise ValueError(f"scale must be float32 or float16 bits (uint16), not {scale.dtype}")


class QuantizedCodesT:
    """One matrix in this module's layout (see the module doc); `n` real columns."""

    def __init__(
        self,
        codes: np.ndarray,
        scale: Scales,
        low: Offsets,
        group: int,
        bits: int,
        n: int | None = None,
    ) -> None:
        if bits not in (4, 8) or codes.dtype != (np.uint8 if bits == 4 else np.int8):
            raise ValueError(f"{bits}-bit codes cannot be {codes.dtype}")
        chunks, tiles = codes.shape[0], codes.shape[1]
        depth = 32 if bits == 4 else codes.shape[-1] // TILE  # elements of K per tile block
        per_block = 256 if bits == 4 else TILE * depth  # bytes
        if codes.ndim != 4 or depth not in (16, 32) or codes.shape[3] != per_block:
            raise ValueError(f"{bits}-bit codes {codes.shape} are not [chunks, tiles, K/A, A*16]")
        if isinstance(scale, tuple) or isinstance(low, tuple):
            check_super_blocks(scale, low, chunks, tiles)
        else:
            _check_meta(scale, low, codes.shape)
        self.codes, self.scale, self.low = codes, scale, low
        self.group, self.bits = group, bits
        self.n = chunks * tiles * TILE if n is None else n

    @property
    def width(self) -> int:
        """Columns per chunk (Nc)."""
        tiles: int = self.codes.shape[1]
        return tiles * TILE

    @property
    def k(self) -> int:
        depth = 32 if self.bits == 4 else self.codes.shape[3] // TILE
        blocks: int = self.codes.shape[2]
        return blocks * depth

    @property
    def act_group(self) -> int:
        return min(self.group, ACT_GROUP)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + meta_bytes(self.scale) + meta_bytes(self.low)

    def scale_of(self, chunk: int) -> Scales:
        """One chunk's scales: its part of the array, or of each super-block array."""
        return meta_of(self.scale, chunk)

    def low_of(self, chunk: int) -> Offsets:
        """One chunk's offsets: its part of the array(s), or the multiplier or None as they are."""
        return meta_of(self.low, chunk)


def matmul(ns: SimpleNamespace, w: QuantizedCodesT, x: np.ndarray, threads: int) -> np.ndarray:
    """x float32 [M, K] @ W.T -> float32 [chunks, M, Nc] (see `columns`), activations
    rounded to int8 per group."""
    if x.ndim != 2 or x.shape[1] != w.k:
        raise ValueError(f"x must be [M, {w.k}], got {list(x.shape)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    args = (w.codes, w.scale, w.low, x, w.act_group, w.group)
    if threads > 1 and w.codes.shape[0] > 1:
        ns.numba.set_num_threads(min(threads, ns.numba.config.NUMBA_NUM_THREADS))
        y: np.ndarray = ns.parallel[w.bits](*args)
    else:
        y = ns.serial[w.bits](*args)
    return y


def matmul_bf16(
    ns: SimpleNamespace, w: QuantizedCodesT, bits: np.ndarray, threads: int
) -> np.ndarray:
    """x [M, K] as bfloat16 bits (uint16) @ W.T -> [M, n] bfloat16 bits."""
    if bits.ndim != 2 or bits.shape[1] != w.k or bits.dtype != np.uint16:
        raise ValueError(f"x must be uint16 [M, {w.k}], got {bits.dtype} {list(bits.shape)}")
    args = (w.codes, w.scale, w.low, np.ascontiguousarray(bits), w.act_group, w.group, w.n)
    if threads > 1 and w.codes.shape[0] > 1:
        ns.numba.set_num_threads(min(threads, ns.numba.config.NUMBA_NUM_THREADS))
        y: np.ndarray = ns.parallel_bf16[w.bits](*args)
    else:
        y = ns.serial_bf16[w.bits](*args)
    return y


def columns(y: np.ndarray, n: int) -> np.ndarray:
    """matmul's [chunks, M, Nc] as [M, n] (a view where M is 1)."""
    chunks, m, width = y.shape
    return y.transpose(1, 0, 2).reshape(m, chunks * width)[:, :n]


def dequantize_t(ns: SimpleNamespace, w: QuantizedCodesT, chunk: int | None = None) -> np.ndarray:
    """W.T as float32 [K, chunks * Nc] (one chunk's columns only when `chunk` is given): the
    layout read back, which the tests hold against the format's own dequantization."""
    chunks, width = w.codes.shape[0], w.width
    picked = range(chunks) if chunk is None else [chunk]
    if len(picked) == 1:
        c = picked[0]
        out = np.empty((w.k, width), np.float32)
        ns.dequantize[w.bits](w.codes[c], w.scale_of(c), w.low_of(c), w.group, out)
        return out
    out = np.empty((w.k, chunks * width), np.float32)
    for c in picked:
        out[:, c * width : (c + 1) * width] = dequantize_t(ns, w, c)
    return out


def dequantize_bf16(ns: SimpleNamespace, w: QuantizedCodesT, threads: int) -> np.ndarray:
    """W as bfloat16 bits, uint16 [chunks * Nc, K] (the first `w.n` rows are real), for a
    bfloat16 GEMM on long prefill chunks (engine/quant/cpu_layout.gemv_matmul)."""
    out = np.empty((w.codes.shape[0] * w.width, w.k), np.uint16)
    if threads > 1 and w.codes.shape[0] > 1:
        ns.numba.set_num_threads(min(threads, ns.numba.config.NUMBA_NUM_THREADS))
        ns.dequantize_bf16_parallel[w.bits](w.codes, w.scale, w.low, w.group, out)
    else:
        width = w.width
        for c in range(w.codes.shape[0]):
            chunk = out[c * width : (c + 1) * width]
            ns.dequantize_bf16[w.bits](w.codes[c], w.scale_of(c), w.low_of(c), w.group, chunk)
    return out
