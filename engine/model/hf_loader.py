"""HF model folder (config.json, *.safetensors, tokenizer files) -> config, weights, tokenizer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvscope.engine.memory.model_too_large import ModelTooLargeError
from kvscope.engine.model import gemma3_config
from kvscope.engine.model.config_limits import check_layer_count, check_sizes
from kvscope.engine.model.loaded_model import LoadedModel, check_weights, turn_end_token_ids
from kvscope.engine.model.model_config import FULL, SLIDING, ModelConfig
from kvscope.engine.model.remote_code import refuse_remote_code
from kvscope.engine.model.templates.fallbacks import ensure_chat_template
from kvscope.engine.model.weight_source import SafetensorsSource

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    gemma3_config.HF_ARCHITECTURE: "gemma3",
}


def load_hf_folder(path: Path) -> LoadedModel:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model folder does not exist: {path}")
    hf = _read_json(path / "config.json")
    arch = _architecture(hf, path)
    tokenizer = _tokenizer(path)
    # None of its own: a plain transcript for a base model, else its family's (chat_templates).
    ensure_chat_template(tokenizer, arch, [path.name, str(hf.get("_name_or_path", ""))])
    try:
        config = _config(hf, arch, _eos_ids(hf, path, tokenizer), path)
    except KeyError as e:
        raise ValueError(f"{path / 'config.json'} lacks the key {e}") from e
    # Rotary tables are recomputed from the config; a tied head is the embedding itself.
    skip = ["lm_head.weight"] if config.tie_word_embeddings else []
    weights = SafetensorsSource(_weight_files(path), skip=skip)
    layers = {
        int(n.split(".")[2])
        for n in weights.shapes()
        if n.startswith("model.layers.") and n.split(".")[2].isdigit()
    }
    check_layer_count(str(path), "num_hidden_layers", config.num_layers, layers)
    check_weights(config, weights.shapes(), str(path))
    return LoadedModel(config, weights, tokenizer, source=str(path), kind="hf")


def hf_config(path: Path) -> ModelConfig:
    """The ModelConfig from config.json alone: no weights, no tokenizer (eos from config.json)."""
    path = Path(path)
    hf = _read_json(path / "config.json")
    arch = _architecture(hf, path)
    try:
        return _config(hf, arch, tuple(dict.fromkeys(_ids(hf.get("eos_token_id")))), path)
    except KeyError as e:
        raise ValueError(f"{path / 'config.json'} lacks the key {e}") from e


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ValueError(f"{file} is missing; an HF model folder needs it")
    try:
        data: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
        return data
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e


def _architecture(hf: dict[str, Any], path: Path) -> str:
    name = (hf.get("architectures") or ["<none>"])[0]
    if name not in ARCHITECTURES:
        raise ValueError(
            f"{path}: architecture {name!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    # Gemma's activation is checked by its own forward (engine/model/gemma3.py).
    if ARCHITECTURES[name] != "gemma3" and hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{path}: hidden_act {hf['hidden_act']!r} is not supported (only silu)")
    return ARCHITECTURES[name]


def _config(
    hf: dict[str, Any], arch: str, eos_token_ids: tuple[int, ...], path: Path
) -> ModelConfig:
    heads = hf["num_attention_heads"]
    source = str(path / "config.json")
    check_sizes(
        source,
        hidden=("hidden_size", hf["hidden_size"]),
        heads=("num_attention_heads", heads),
        kv_heads=("num_key_value_heads", hf.get("num_key_value_heads") or heads),
        layers=("num_hidden_layers", hf["num_hidden_layers"]),
        intermediate=("intermediate_size", hf["intermediate_size"]),
        context=("max_position_embeddings", hf["max_position_embeddings"]),
        vocab=("vocab_size", hf["vocab_size"]),
    )
    check_sizes(source, head_dim=("head_dim", hf.get("head_dim") or hf["hidden_size"] // heads))
    rope_theta, rope_scaling = _rope(hf)
    config = ModelConfig(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        max_position_embeddings=hf["max_position_embeddings"],
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        rope_scaling=rope_scaling,
        # Qwen2 always has q/k/v biases; its config has no switch for them.
        attention_bias=arch == "qwen2" or hf.get("attention_bias", False),
        qk_norm=arch == "qwen3",
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_token_ids,
        name=path.name,
        **_sliding(hf, arch),
    )
    if arch == "gemma3":  # its own ropes per layer kind, post-norms, scales and window pattern
        return replace(config, **gemma3_config.hf_fields(hf, source))
    return config


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and HF-style rope_scaling, from transformers-5 `rope_parameters` or older keys."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    return theta, None if rope_type == "default" else {"rope_type": rope_type, **params}


class _SlidingFields(TypedDict, total=False):
    sliding_window: int
    layer_types: tuple[str, ...]


def _sliding(hf: dict[str, Any], arch: str) -> _SlidingFields:
    """sliding_window and layer_types for the Llama-family configs that slide: Mistral whenever
    a window is set (every layer); Qwen2 only with use_sliding_window, and then only the layers
    from max_window_layers on (HF's rule), unless config.json lists layer_types itself. The
    window is honoured by the kernels, not used to cap the context."""
    window = hf.get("sliding_window")
    if arch == "mistral" and window:
        return {"sliding_window": int(window)}
    if arch == "qwen2" and window and hf.get("use_sliding_window", False):
        n = hf["num_hidden_layers"]
        types = hf.get("layer_types") or [
            SLIDING if i >= hf.get("max_window_layers", 28) else FULL for i in range(n)
        ]
        if SLIDING not in types:
            return {}
        return {"sliding_window": int(window), "layer_types": tuple(types)}
    return {}


def _ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _eos_ids(hf: dict[str, Any], path: Path, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """config.json's eos, generation_config.json's (often a list), and the chat turn end."""
    generation = path / "generation_config.json"
    eos = _ids(hf.get("eos_token_id"))
    if generation.is_file():
        eos += _ids(_read_json(generation).get("eos_token_id"))
    eos += turn_end_token_ids(tokenizer.get_vocab(), tokenizer.chat_template)
    return tuple(dict.fromkeys(eos))


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set(_read_json(index).get("weight_map", {}).values())
        for name in names:
            # The index is data: its entries name files in this folder, nothing else (an entry
            # like ../../etc/passwd or an absolute path is refused, never opened).
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"{index}: weight file {name!r} is not a file in {path}")
        files = sorted(path / f for f in names)
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    for file in files:
        # Only regular files (a symlink to one, as the HF cache makes, is fine): a FIFO would
        # block the load forever.
        if not file.is_file():
            raise ValueError(f"{file} is not a regular file")
    return files


def _tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        # A folder's auto_map may name Python files of its own: refused, never a prompt.
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            str(path), trust_remote_code=False
        )
        return tokenizer
    except MemoryError as e:  # not the files' fault: say so, not "cannot load the tokenizer"
        raise ModelTooLargeError(
            f"{path}: ran out of host memory while loading its tokenizer; close other programs "
            "and try again"
        ) from e
    except Exception as e:  # transformers raises many types for missing/odd tokenizer files
        refuse_remote_code(e, path)
        raise ValueError(f"{path}: cannot load the tokenizer: {e}") from e
