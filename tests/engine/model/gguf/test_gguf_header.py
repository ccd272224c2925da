"""A GGUF header read through ranged reads (read_gguf_header, read_remote_gguf) against the local
reader: the same metadata and tensor list from a prefix of the file, a split file's parts summed,
llama3's rope_freqs read, and damaged headers refused without reading a file whole."""

import struct
from pathlib import Path

import pytest
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf, make_tiny_gguf

from kvscope.engine.model.gguf import file as gguf_file
from kvscope.engine.model.gguf.file import FIRST_HEADER_READ, read_gguf, read_gguf_header
from kvscope.engine.model.gguf.loader import GGUFSource, gguf_config
from kvscope.engine.model.gguf.remote import read_remote_gguf
from kvscope.engine.model.loader import default_model_path


class CountingBytes:
    """A file's bytes read through slices, as a remote file is; counts what was read."""

    def __init__(self, data: bytes) -> None:
        self.data, self.read_bytes, self.reads = data, 0, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: slice) -> bytes:
        chunk = self.data[key]
        self.read_bytes += len(chunk)
        self.reads += 1
        return chunk


def test_header_of_bundled_model_matches_local_reader_from_a_prefix():
    path = default_model_path()
    source = CountingBytes(path.read_bytes())
    header = read_gguf_header(source, path.name)
    local = read_gguf(path)
    assert header.metadata == local.metadata
    assert (header.version, header.alignment, header.data_offset) == (
        local.version,
        local.alignment,
        local.data_offset,
    )
    infos = [(t.name, t.qtype, t.shape, t.offset, t.nbytes) for t in header.tensors]
    assert infos == [(t.name, t.qtype, t.shape, t.offset, t.nbytes) for t in local.tensors]
    assert all(t.data.size == 0 for t in header.tensors)  # no tensor data was read
    # The prefix doubles from FIRST_HEADER_READ: never more than twice the header.
    assert source.read_bytes <= max(2 * local.data_offset, FIRST_HEADER_READ)
    assert source.read_bytes < len(source) / 40  # 49k-token vocabulary: ~2 MB of a 98 MB file


def test_remote_gguf_sizes_the_model_as_the_local_header_does(tmp_path: Path):
    path, _ = make_tiny_gguf("llama", tmp_path / "tiny.gguf", llama3_rope=True)
    remote = read_remote_gguf([CountingBytes(path.read_bytes())], path.name)
    local = read_gguf(path)
    # llama3's rope scaling comes from the rope_freqs tensor's data, read on its own.
    assert remote.config == gguf_config(local)
    assert remote.config.rope_scaling is not None
    source = GGUFSource(local, {})
    assert (remote.shapes, remote.kinds) == (source.shapes(), source.kinds())
    assert remote.header_bytes == local.data_offset
    assert remote.problem is None


def test_split_gguf_parts_add_up_to_the_whole_model(tmp_path: Path):
    whole = make_quant_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    parts = write_split_gguf(whole, tmp_path / "parts", max_tensors=8)
    assert len(parts) == 3
    remote = read_remote_gguf([CountingBytes(p.read_bytes()) for p in parts], whole.name)
    single = read_remote_gguf([CountingBytes(whole.read_bytes())], whole.name)
    assert (remote.shapes, remote.kinds) == (single.shapes, single.kinds)
    assert remote.config == single.config
    assert remote.problem is None  # the loader reads a split model from its parts
    with pytest.raises(ValueError, match="says 3 parts, 2 were given"):
        read_remote_gguf([CountingBytes(p.read_bytes()) for p in parts[:2]], whole.name)


def test_a_tensor_type_the_engine_lacks_is_a_problem_not_an_error(tmp_path: Path):
    path = make_quant_gguf(tmp_path / "tiny-Q2_K.gguf", "Q2_K")
    remote = read_remote_gguf([CountingBytes(path.read_bytes())], path.name)
    assert remote.problem is not None and "Q2_K" in remote.problem
    assert remote.config.num_layers == 2  # still sized


def test_truncated_and_corrupt_headers_are_refused_without_reading_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path, _ = make_tiny_gguf("llama", tmp_path / "tiny.gguf")
    data = path.read_bytes()
    header_end = read_gguf(path).data_offset
    with pytest.raises(ValueError, match="tiny.gguf: .*truncated"):
        read_gguf_header(CountingBytes(data[: header_end // 2]), "tiny.gguf")
    # A vocabulary claiming 2**40 strings in a 3 GB file: refused by its count, before a read
    # past the first prefix.
    count_at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4
    corrupt = bytearray(data)
    corrupt[count_at : count_at + 8] = struct.pack("<Q", 1 << 40)
    padded = PaddedBytes(bytes(corrupt), 3 << 30)
    with pytest.raises(ValueError, match="strings cannot fit"):
        read_gguf_header(padded, "tiny.gguf")
    assert padded.read_bytes <= FIRST_HEADER_READ
    # A string as long as the file says it is must be read; MAX_HEADER_READ bounds that.
    monkeypatch.setattr(gguf_file, "MAX_HEADER_READ", 1 << 20)
    long_string = bytearray(data)
    key_len_at = data.index(b"general.architecture") - 8
    long_string[key_len_at : key_len_at + 8] = struct.pack("<Q", 2 << 20)
    padded = PaddedBytes(bytes(long_string), 3 << 30)
    with pytest.raises(ValueError, match="runs past its first"):
        read_gguf_header(padded, "tiny.gguf")
    assert padded.read_bytes <= 2 << 20


class PaddedBytes(CountingBytes):
    """`data` followed by zeros up to `size`, without holding the zeros."""

    def __init__(self, data: bytes, size: int) -> None:
        super().__init__(data)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> bytes:
        start, stop, _ = key.indices(self.size)
        chunk = self.data[start:stop] + bytes(max(0, stop - max(start, len(self.data))))
        self.read_bytes += len(chunk)
        return chunk
