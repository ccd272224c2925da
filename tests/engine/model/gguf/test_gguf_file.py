"""Our GGUF parser against gguf.GGUFReader (the bundled model, tiny models, every value type),
and corrupt files, which must raise a ValueError naming the file rather than hang or allocate."""

import random
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from tiny_models import ARCHITECTURES, make_tiny_gguf

from kvscope.engine.model.gguf.file import GGUFFile, read_gguf
from kvscope.engine.model.loader import default_model_path

NESTED = [[1, 2], [3], [4, 5, 6]]
ARRAY = GGUFValueType.ARRAY


def assert_same_as_reader(ours: GGUFFile, reader: gguf.GGUFReader) -> None:
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == fields
    assert ours.version == reader.fields["GGUF.version"].contents()
    assert (ours.alignment, ours.data_offset) == (reader.alignment, reader.data_offset)
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(ours.tensors, reader.tensors, strict=True):
        assert mine.qtype == theirs.tensor_type, mine.name
        assert mine.shape == tuple(reversed(theirs.shape.tolist())), mine.name
        # Same dtype, shape and bytes: what gguf.quants.dequantize is handed.
        assert (mine.data.dtype, mine.data.shape) == (theirs.data.dtype, theirs.data.shape)
        assert mine.data.tobytes() == theirs.data.tobytes(), mine.name


def test_bundled_model_matches_gguf_reader():
    path = default_model_path()
    ours = read_gguf(path)
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    assert_same_as_reader(ours, gguf.GGUFReader(path))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_models_match_gguf_reader(tmp_path, arch):
    path, _ = make_tiny_gguf(arch, tmp_path / "m.gguf", llama3_rope=arch == "llama")
    assert_same_as_reader(read_gguf(path), gguf.GGUFReader(path))


def write_every_type(path: Path) -> Path:
    """Every metadata value type, a nested array, 64-byte alignment, plain and quantized data."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    scalars = {
        GGUFValueType.UINT8: 255,
        GGUFValueType.INT8: -128,
        GGUFValueType.UINT16: 65535,
        GGUFValueType.INT16: -32768,
        GGUFValueType.UINT32: 2**32 - 1,
        GGUFValueType.INT32: -(2**31),
        GGUFValueType.FLOAT32: 0.1,
        GGUFValueType.BOOL: True,
        GGUFValueType.UINT64: 2**64 - 1,
        GGUFValueType.INT64: -(2**63),
        GGUFValueType.FLOAT64: 0.1,
        GGUFValueType.STRING: "héllo 🤖 中文",
    }
    for vtype, value in scalars.items():
        w.add_key_value(f"t.{vtype.name}", value, vtype)
        w.add_key_value(f"a.{vtype.name}", [value, value], GGUFValueType.ARRAY, sub_type=vtype)
    w.add_array("t.nested", NESTED)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal(7).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    for qtype in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.BF16):
        data = gguf.quants.quantize(rng.standard_normal((4, 64), dtype=np.float32), qtype)
        w.add_tensor(qtype.name.lower(), data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_value_type_and_alignment(tmp_path):
    path = write_every_type(tmp_path / "all.gguf")
    ours = read_gguf(path)
    assert ours.alignment == 64 and ours.data_offset % 64 == 0
    assert ours.metadata["t.nested"] == NESTED
    assert ours.metadata["t.FLOAT32"] == float(np.float32(0.1))
    assert ours.metadata["a.STRING"] == ["héllo 🤖 中文"] * 2
    # GGUFReader flattens nested arrays; compare the rest directly.
    reader = gguf.GGUFReader(path)
    assert reader.fields.pop("t.nested").contents() == [x for row in NESTED for x in row]
    ours.metadata.pop("t.nested")
    assert_same_as_reader(ours, reader)
    assert {t.name: t.shape for t in ours.tensors} == {
        "f32": (3, 5),
        "f16": (7,),
        "i32": (2, 3),
        "q8_0": (4, 64),
        "bf16": (4, 64),
    }


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gguf_str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def array_of(item_type: int, count: int) -> bytes:
    """A metadata value's type (ARRAY), then the array's item type and count."""
    return struct.pack("<I", ARRAY) + struct.pack("<IQ", item_type, count)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "too short"),
        (b"GGML" + bytes(40), "not a GGUF file"),
        (header(0, 0, version=1), "version 1"),
        (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
        (header(0, 2**62), "cannot fit"),
        (header(2**62, 0), "cannot fit"),
        (header(0, 1) + struct.pack("<Q", 2**63) + bytes(16), "truncated"),
        (header(0, 1) + gguf_str(b"k") + struct.pack("<I", 99), "unknown metadata value type"),
        (header(0, 1) + gguf_str(b"k") + array_of(GGUFValueType.UINT8, 2**62), "truncated"),
        (header(0, 1) + gguf_str(b"k") + array_of(GGUFValueType.STRING, 2**40), "cannot fit"),
        (
            header(0, 1) + gguf_str(b"k") + array_of(ARRAY, 1) + struct.pack("<IQ", ARRAY, 1) * 20,
            "nested deeper",
        ),
        (header(0, 1) + gguf_str(b"k") + struct.pack("<I", 8) + gguf_str(b"\xff"), "not UTF-8"),
        (header(0, 2) + (gguf_str(b"k") + struct.pack("<IB", 0, 1)) * 2, "duplicate metadata"),
        (
            header(0, 1) + gguf_str(b"general.alignment") + struct.pack("<II", 4, 3),
            "power of two",
        ),
        (
            header(0, 1) + gguf_str(b"general.alignment") + struct.pack("<IQ", 10, 32),
            "expected UINT32",
        ),
        (header(1, 0) + gguf_str(b"t") + struct.pack("<I", 9) + bytes(64), "more than 4"),
        (header(1, 0) + gguf_str(b"t") + struct.pack("<IQIQ", 1, 4, 999, 0), "unknown ggml"),
        (header(1, 0) + gguf_str(b"t") + struct.pack("<IQIQ", 1, 2**40, 0, 0), "past the end"),
        (header(1, 0) + gguf_str(b"t") + struct.pack("<IQIQ", 1, 31, 8, 0), "not whole Q8_0"),
    ],
)
def test_malformed_files_raise_value_error_naming_them(tmp_path, data, match):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match) as e:
        read_gguf(path)
    assert "bad.gguf" in str(e.value)


def test_every_truncation_raises_value_error(tmp_path):
    whole = make_tiny_gguf("qwen2", tmp_path / "m.gguf")[0].read_bytes()
    path = tmp_path / "cut.gguf"
    for end in [*range(0, read_gguf(tmp_path / "m.gguf").data_offset, 13), len(whole) - 1]:
        path.write_bytes(whole[:end])
        with pytest.raises(ValueError, match="cut.gguf"):
            read_gguf(path)


def test_random_corruption_parses_or_raises_value_error(tmp_path):
    source = make_tiny_gguf("llama", tmp_path / "m.gguf")[0]
    whole, data_offset = source.read_bytes(), read_gguf(source).data_offset
    path, rng = tmp_path / "fuzz.gguf", random.Random(0)
    for _ in range(300):
        damaged = bytearray(whole)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(data_offset)] = rng.randrange(256)
        path.write_bytes(damaged)
        try:
            read_gguf(path)
        except ValueError as e:
            assert "fuzz.gguf" in str(e)
