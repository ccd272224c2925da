"""A lean, bounds-checked GGUF reader: metadata as Python values, tensors as views of an mmap.

gguf.GGUFReader builds a numpy view for every metadata element, which takes seconds for a
49k-token vocabulary. Here the file is walked with `struct` over an mmap in tight loops instead.
Every count and length is checked against the bytes left before it is used, so a corrupt file
fails fast with a ValueError naming it rather than looping or allocating without bound.

`read_gguf_header` parses the same way over a file read on demand (`GGUFBytes`: HTTP Range reads
of a file on a hub), reading a growing prefix until the header parses; no tensor data is read.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from kvscope.engine.input_file import open_input_file

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
HEADER_SIZE = 24  # magic, version, tensor count, metadata count
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp never writes more
MAX_ARRAY_DEPTH = 8  # real files nest at most once; deeper only exhausts the recursion limit
MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8  # empty name, n_dims, type, offset
MIN_KV_SIZE = 8 + 4 + 1  # empty key, type, a one-byte value
# A header is the metadata (the tokenizer: 1-10 MB for real vocabularies) and the tensor list;
# the prefix read starts here and doubles, so at most twice the header is ever read.
FIRST_HEADER_READ = 256 << 10
# No real header comes near it (Gemma 3's 262k-token vocabulary: ~6 MB); a corrupt count past
# it would otherwise read a remote file whole, doubling as it goes.
MAX_HEADER_READ = 128 << 20

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# struct formats for the scalar value types; "<" makes them standard-size and little-endian.
_SCALAR_STRUCTS: dict[GGUFValueType, struct.Struct] = {
    t: struct.Struct("<" + f)
    for t, f in [
        (GGUFValueType.UINT8, "B"),
        (GGUFValueType.INT8, "b"),
        (GGUFValueType.UINT16, "H"),
        (GGUFValueType.INT16, "h"),
        (GGUFValueType.UINT32, "I"),
        (GGUFValueType.INT32, "i"),
        (GGUFValueType.FLOAT32, "f"),
        (GGUFValueType.BOOL, "?"),
        (GGUFValueType.UINT64, "Q"),
        (GGUFValueType.INT64, "q"),
        (GGUFValueType.FLOAT64, "d"),
    ]
}
# Arrays of scalars are read in one go with numpy, which takes the same format strings.
_SCALAR_DTYPES = {t: np.dtype(s.format) for t, s in _SCALAR_STRUCTS.items()}
# Tensor types GGUFReader exposes as typed elements; all others (BF16 included) as raw bytes.
_PLAIN_TENSOR_DTYPES: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("<i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order, outermost first (the file lists dims innermost first)
    data: np.ndarray  # read-only view of the file, as GGUFReader gives it to gguf.quants;
    # empty (size 0) from read_gguf_header, which reads no tensor data
    offset: int = 0  # where its bytes start in the file
    nbytes: int = 0
    file: Path | None = None  # the file its bytes are in (a split model's part); None: unknown


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]  # strings, ints, floats, bools, (nested) lists of them
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int  # where tensor data starts; tensor offsets are relative to it


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse a little-endian GGUF v2/v3 file. Raises ValueError naming `path` if it is not one."""
    path = Path(path)
    with open_input_file(path, "GGUF file") as f:  # a regular file: mmap takes no device
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_SIZE:
            raise ValueError(f"{path}: {size} bytes is too short for a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # outlives the descriptor
    return _Parser(path, buf).parse()


class GGUFBytes(Protocol):
    """A file read on demand: its size, and the bytes of a slice of it (HTTP Range reads)."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes: ...


def read_gguf_header(source: GGUFBytes, name: str, first_read: int = FIRST_HEADER_READ) -> GGUFFile:
    """Parse the header of the GGUF file `source` reads, reading a prefix of `first_read` bytes
    and doubling it until the header parses; every tensor's `data` is empty. Raises ValueError
    naming `name` if the file is not one."""
    path, size = Path(name), len(source)
    if size < HEADER_SIZE:
        raise ValueError(f"{path}: {size} bytes is too short for a GGUF header")
    prefix = b""
    want = min(size, max(first_read, HEADER_SIZE))
    while True:
        prefix += source[len(prefix) : want]
        if len(prefix) != want:
            raise ValueError(f"{path}: asked for bytes up to {want}, got {len(prefix)}")
        try:
            return _Parser(path, prefix, size).parse()
        except _PrefixTooShort:
            if want >= MAX_HEADER_READ:
                raise ValueError(
                    f"{path}: the header runs past its first {want:,} bytes; no model's does"
                ) from None
            want = min(size, 2 * want)


class _PrefixTooShort(Exception):
    """The header runs past the prefix read so far (read_gguf_header reads more)."""


class _Parser:
    def __init__(self, path: Path, buf: mmap.mmap | bytes, file_size: int | None = None) -> None:
        # Given the whole file's size, `buf` is a prefix of it and only the header is parsed.
        self.path, self.buf, self.pos = path, buf, 0
        self.header_only = file_size is not None
        self.size = len(buf) if file_size is None else file_size

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def parse(self) -> GGUFFile:
        if self.buf[:4] != MAGIC:
            raise self.fail(f"not a GGUF file (magic {self.buf[:4]!r}, expected {MAGIC!r})")
        self.pos = 4
        version = self.u32()
        if version not in SUPPORTED_VERSIONS and version & 0xFFFF == 0:
            raise self.fail("big-endian GGUF files are not supported")
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(f"GGUF version {version} is not supported ({SUPPORTED_VERSIONS})")
        n_tensors, n_kv = self.u64(), self.u64()
        self.check_count(n_kv, MIN_KV_SIZE, "metadata entries")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            if key in metadata:
                raise self.fail(f"duplicate metadata key {key!r}")
            vtype = self.value_type()
            if key == ALIGNMENT_KEY and vtype != GGUFValueType.UINT32:
                raise self.fail(f"{ALIGNMENT_KEY} has type {vtype.name}, expected UINT32")
            metadata[key] = self.value(vtype, 0)
        self.check_count(n_tensors, MIN_TENSOR_INFO_SIZE, "tensor infos")
        infos = [self.tensor_info() for _ in range(n_tensors)]
        alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise self.fail(f"{ALIGNMENT_KEY} = {alignment} is not a power of two")
        data_offset = -(-self.pos // alignment) * alignment
        tensors = [self.tensor(data_offset, *info) for info in infos]
        if len({t.name for t in tensors}) != len(tensors):
            raise self.fail("duplicate tensor names")
        return GGUFFile(self.path, version, metadata, tensors, alignment, data_offset)

    def take(self, n: int) -> int:
        """Advance past n bytes that must exist; returns where they start."""
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {n} bytes needed, {self.size - self.pos} left")
        if self.pos + n > len(self.buf):
            raise _PrefixTooShort
        start, self.pos = self.pos, self.pos + n
        return start

    def check_count(self, count: int, min_item_size: int, what: str) -> None:
        if count * min_item_size > self.size - self.pos:
            raise self.fail(f"{count} {what} cannot fit in the {self.size - self.pos} bytes left")

    def u32(self) -> int:
        value: int = _U32.unpack_from(self.buf, self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = _U64.unpack_from(self.buf, self.take(8))[0]
        return value

    def string(self) -> str:
        n = self.u64()
        start = self.take(n)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"string is not UTF-8: {e}") from e

    def value_type(self) -> GGUFValueType:
        raw = self.u32()
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"unknown metadata value type {raw}") from None

    def value(self, vtype: GGUFValueType, depth: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype != GGUFValueType.ARRAY:
            scalar = _SCALAR_STRUCTS[vtype]
            return scalar.unpack_from(self.buf, self.take(scalar.size))[0]
        if depth == MAX_ARRAY_DEPTH:
            raise self.fail(f"metadata arrays nested deeper than {MAX_ARRAY_DEPTH}")
        item_type, count = self.value_type(), self.u64()
        if item_type == GGUFValueType.STRING:
            return self.strings(count)
        if item_type == GGUFValueType.ARRAY:
            self.check_count(count, 4 + 8, "nested arrays")
            return [self.value(item_type, depth + 1) for _ in range(count)]
        dtype = _SCALAR_DTYPES[item_type]
        start = self.take(count * dtype.itemsize)
        return np.frombuffer(self.buf, dtype, count, start).tolist()

    def strings(self, count: int) -> list[str]:
        """The hot loop (the whole vocabulary and merge list), so it keeps to local names."""
        self.check_count(count, 8, "strings")
        buf, pos, size, unpack = self.buf, self.pos, len(self.buf), _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                if pos + 8 > size:
                    break
                n = unpack(buf, pos)[0]
                pos += 8
                if n > size - pos:
                    break
                append(buf[pos : pos + n].decode("utf-8"))
                pos += n
        except UnicodeDecodeError as e:
            self.pos = pos
            raise self.fail(f"string {len(out)} of an array is not UTF-8: {e}") from e
        self.pos = pos
        if len(out) < count and len(buf) < self.size:
            raise _PrefixTooShort
        if len(out) < count:
            raise self.fail(f"truncated: string {len(out)} of {count} runs past the end")
        return out

    def tensor_info(self) -> tuple[str, list[int], GGMLQuantizationType, int]:
        name = self.string()
        n_dims = self.u32()
        if n_dims > MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dims, more than {MAX_DIMS}")
        dims = [self.u64() for _ in range(n_dims)]
        raw_type = self.u32()
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise self.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        return name, dims, qtype, self.u64()

    def tensor(
        self, data_offset: int, name: str, dims: list[int], qtype: GGMLQuantizationType, offset: int
    ) -> GGUFTensor:
        shape = tuple(reversed(dims))
        n_elements = math.prod(dims)
        dtype = _PLAIN_TENSOR_DTYPES.get(qtype)
        if dtype is not None:
            count, data_shape = n_elements, shape
            n_bytes = n_elements * dtype.itemsize
        else:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if not dims or dims[0] % block_size:
                raise self.fail(
                    f"tensor {name!r} rows of {dims[:1]} are not whole {qtype.name} blocks "
                    f"of {block_size}"
                )
            dtype, n_bytes = np.dtype(np.uint8), n_elements // block_size * type_size
            count, data_shape = n_bytes, (*shape[:-1], dims[0] // block_size * type_size)
        start = data_offset + offset
        if start + n_bytes > self.size:
            raise self.fail(
                f"tensor {name!r} ({n_bytes} bytes at {start}) runs past the end of the file"
            )
        if self.header_only:
            data = np.empty(0, dtype)
        else:
            data = np.frombuffer(self.buf, dtype, count, start).reshape(data_shape)
        return GGUFTensor(name, qtype, shape, data, start, n_bytes, self.path)
