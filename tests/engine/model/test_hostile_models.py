"""Model files written to hurt: their own code is never run, absurd headers are refused before
anything is allocated."""

import io
import json
import sys

import gguf
import numpy as np
import pytest
from tiny_models import make_tiny_gguf, make_tiny_model

from kvscope.engine.model.loader import load_model
from kvscope.engine.model.remote_code import RemoteCodeRefused
from kvscope.engine.sizing.planner import plan_kv


def _arm_remote_code(folder, marker):
    """An auto_map naming a tokenizer class in a .py file beside the weights, as a hub repo with
    custom code has; importing that file writes `marker`."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
    )


class _NoStdin(io.StringIO):
    def read(self, *a):
        raise AssertionError("the loader asked the terminal a question")

    readline = read


def test_an_hf_folder_never_runs_its_own_code(tmp_path, default_model, monkeypatch):
    folder = make_tiny_model("llama", tmp_path / "m", tokenizer=default_model.tokenizer)
    marker = tmp_path / "PWNED"
    _arm_remote_code(folder, marker)
    monkeypatch.setattr(sys, "stdin", _NoStdin())  # transformers would prompt "[y/N]" here
    loaded = load_model(folder)
    assert not marker.exists()
    assert loaded.tokenizer("Hello world").input_ids == [19556, 905]


def test_a_gguf_beside_a_code_carrying_folder_never_runs_it(tmp_path, monkeypatch):
    path, _ = make_tiny_gguf("llama", tmp_path / "m.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "evil.Cfg"}}))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
    )
    marker = tmp_path / "PWNED"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setattr(sys, "stdin", _NoStdin())
    with pytest.raises(RemoteCodeRefused, match="never runs a model's code"):
        load_model(path)
    assert not marker.exists()


def _gguf_with(tmp_path, name, **overrides):
    """The tiny Llama GGUF with some header values replaced (written afresh, tensors intact)."""
    path, _ = make_tiny_gguf("llama", tmp_path / "src.gguf")
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(tmp_path / name, "llama")
    for field in reader.fields.values():
        key = field.name
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key in overrides:
            value = overrides[key]
        writer.add_key_value(
            key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None
        )
    for t in reader.tensors:
        writer.add_tensor(
            t.name,
            np.array(t.data),
            raw_shape=list(reversed(t.shape.tolist())),
            raw_dtype=t.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / name


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.block_count", 10**9, r"block_count 1000000000 is not a plausible"),
        ("llama.block_count", 3, r"block_count 3 does not match the file.* 2 layers"),
        ("llama.context_length", 2**32 - 1, r"context_length 4294967295"),
        ("llama.context_length", 1, r"context_length 1"),
        ("llama.embedding_length", 10**9, r"embedding_length"),
        ("llama.attention.head_count", 0, r"head_count"),
    ],
)
def test_absurd_header_values_are_refused_before_allocating(tmp_path, key, value, match):
    path = _gguf_with(tmp_path, "bad.gguf", **{key: value})
    with pytest.raises(ValueError, match=match):
        load_model(path)
    with pytest.raises(ValueError, match=match):
        plan_kv(path, context=64)


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/etc/passwd", "sub/../../x"])
def test_a_sharded_index_cannot_point_outside_the_folder(tmp_path, default_model, entry):
    folder = make_tiny_model(
        "llama", tmp_path / "m", max_shard_size="1MB", tokenizer=default_model.tokenizer
    )
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = entry
    index.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="is not a file in"):
        load_model(folder)


def test_a_fifo_among_the_weights_is_refused_not_waited_on(tmp_path, default_model):
    import os

    folder = make_tiny_model(
        "llama", tmp_path / "m", max_shard_size="1MB", tokenizer=default_model.tokenizer
    )
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = "pipe.safetensors"
    index.write_text(json.dumps(data))
    os.mkfifo(folder / "pipe.safetensors")
    with pytest.raises(ValueError, match="not a regular file"):
        load_model(folder)


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        (b"hello", "prompt is bytes"),
        ([1, True, 2], "outside the vocabulary"),
        ("caf\udce9", "not valid text"),
    ],
)
def test_odd_prompts_get_a_clear_error_and_the_engine_goes_on(default_llm, prompt, match):
    from kvscope.engine import SamplingParams

    with pytest.raises(ValueError, match=match):
        default_llm.generate(prompt, SamplingParams(max_tokens=2))
    assert default_llm.generate("Hi", SamplingParams(max_tokens=2))[0].outputs[0].token_ids


def test_a_crafted_recording_cannot_ask_for_a_huge_pool(tmp_path):
    from kvscope.engine.kv.events import FORMAT_VERSION
    from kvscope.engine.kv.replay import replay_events

    path = tmp_path / "session.jsonl"
    header = {
        "kvscope_events": FORMAT_VERSION,
        "num_blocks": 10**12,
        "block_size": 16,
        "allocator": "paged",
    }
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(ValueError, match="num_blocks"):
        next(replay_events(path))
