"""A split GGUF (`-00001-of-0000N.gguf`, written by gguf-py's own splitting writer, as llama.cpp's
converter writes them) loads from any of its parts and runs as the file in one piece does;
a missing or mislabelled part is refused in words."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.gguf.split import read_gguf_model, split_part_number
from kvscope.engine.model.gguf.summary import summarize_gguf
from kvscope.engine.sizing.planner import model_config


@pytest.fixture(scope="module")
def whole_and_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("split")
    whole = make_quant_gguf(folder / "tiny-Q8_0.gguf", "Q8_0", types={"attn_v": "Q6_K"})
    parts = write_split_gguf(whole, folder / "parts", max_tensors=8)
    return whole, parts


def test_the_parts_are_named_and_counted_as_llama_cpp_names_them(whole_and_parts) -> None:
    _, parts = whole_and_parts
    assert [p.name for p in parts] == [f"tiny-Q8_0-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    assert [split_part_number(p) for p in parts] == [(1, 3), (2, 3), (3, 3)]
    assert split_part_number("model-00001-of-00001.gguf") is None  # one part: a plain file
    assert split_part_number("tiny-Q8_0.gguf") is None


def test_every_part_reads_as_the_whole_model(whole_and_parts) -> None:
    whole, parts = whole_and_parts
    single = read_gguf_model(whole)
    for part in parts:
        joined = read_gguf_model(part)
        assert joined.path == parts[0]
        assert [(t.name, t.qtype, t.shape) for t in joined.tensors] == [
            (t.name, t.qtype, t.shape) for t in single.tensors
        ]
        assert {t.file for t in joined.tensors} == set(parts)
    assert summarize_gguf(parts[1]).quantization == summarize_gguf(whole).quantization
    split_config, single_config = model_config(str(parts[0])), model_config(str(whole))
    assert replace(split_config, name=single_config.name) == single_config


def test_each_tensor_reads_the_same_bytes_from_its_part(whole_and_parts) -> None:
    whole, parts = whole_and_parts
    single = {t.name: t for t in read_gguf_model(whole).tensors}
    for t in read_gguf_model(parts[0]).tensors:
        assert t.file is not None
        with open(t.file, "rb") as f:
            f.seek(t.offset)
            assert f.read(t.nbytes) == single[t.name].data.tobytes(), t.name


def test_greedy_tokens_match_the_file_in_one_piece(whole_and_parts) -> None:
    whole, parts = whole_and_parts
    greedy = SamplingParams(temperature=0, max_tokens=12)
    replies = []
    for model in (whole, parts[2]):
        llm = LLM(model=str(model), device="cpu", num_kv_blocks=16)
        replies.append(llm.generate([[5, 17, 42, 99, 7]], greedy)[0].outputs[0].token_ids)
    assert replies[0] == replies[1] and len(replies[0]) == 12


def test_a_missing_part_is_named(whole_and_parts, tmp_path: Path) -> None:
    _, parts = whole_and_parts
    for part in parts[:2]:
        shutil.copy(part, tmp_path / part.name)
    with pytest.raises(
        FileNotFoundError,
        match=r"split into 3 parts; missing beside it: "
        r"tiny-Q8_0-00003-of-00003\.gguf",
    ):
        read_gguf_model(tmp_path / parts[0].name)


def test_parts_that_disagree_with_their_names_are_refused(whole_and_parts, tmp_path: Path) -> None:
    _, parts = whole_and_parts
    # The second and third parts swapped under each other's names.
    shutil.copy(parts[0], tmp_path / parts[0].name)
    shutil.copy(parts[1], tmp_path / parts[2].name)
    shutil.copy(parts[2], tmp_path / parts[1].name)
    with pytest.raises(ValueError, match=r"says part 2 of 3 \(0-based\), expected part 1 of 3"):
        read_gguf_model(tmp_path / parts[0].name)


def test_a_first_part_renamed_as_a_plain_file_says_why_it_cannot_load(
    whole_and_parts, tmp_path: Path
) -> None:
    _, parts = whole_and_parts
    lone = tmp_path / "renamed.gguf"
    shutil.copy(parts[0], lone)
    with pytest.raises(ValueError, match=r"part 1 of a model split into 3.*not named as a part"):
        read_gguf_model(lone)
