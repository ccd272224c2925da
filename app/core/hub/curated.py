"""Good small instruct models, for the "Get a model" screen before the user types anything.

A static table (no request): repo ids as they are on the Hugging Face Hub, with the licence each
model's card declares. Every one is an architecture the engine runs (Llama, Qwen2, Qwen3,
Gemma 3) in single-file GGUFs; Phi-3.5 mini is left out (the engine has no Phi-3), and for
Qwen2.5 7B bartowski's repo stands in for Qwen's own, whose GGUFs are split into parts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CuratedModel:
    repo: str
    license: str  # the card's `license:` id ("apache-2.0", "llama3.2", "gemma", ...)
    description: str


CURATED_MODELS = (
    CuratedModel(
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        "apache-2.0",
        "Qwen2.5 0.5B Instruct: the smallest that holds a conversation; 32k context",
    ),
    CuratedModel(
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        "llama3.2",
        "Llama 3.2 1B Instruct: Meta's small multilingual chat model; 128k context",
    ),
    CuratedModel(
        "ggml-org/gemma-3-1b-it-GGUF",
        "gemma",
        "Gemma 3 1B it: Google's small chat model, sliding-window attention; 32k context",
    ),
    CuratedModel(
        "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
        "apache-2.0",
        "Qwen2.5 1.5B Instruct: multilingual chat and code; 32k context",
    ),
    CuratedModel(
        "bartowski/SmolLM2-1.7B-Instruct-GGUF",
        "apache-2.0",
        "SmolLM2 1.7B Instruct: Hugging Face's small English chat model; 8k context",
    ),
    CuratedModel(
        "Qwen/Qwen3-1.7B-GGUF",
        "apache-2.0",
        "Qwen3 1.7B: chat with an optional thinking mode; 32k context",
    ),
    CuratedModel(
        "Qwen/Qwen2.5-3B-Instruct-GGUF",
        "qwen-research",
        "Qwen2.5 3B Instruct: a step up in quality; research licence; 32k context",
    ),
    CuratedModel(
        "bartowski/Llama-3.2-3B-Instruct-GGUF",
        "llama3.2",
        "Llama 3.2 3B Instruct: Meta's mid-size small model; 128k context",
    ),
    CuratedModel(
        "ggml-org/gemma-3-4b-it-GGUF",
        "gemma",
        "Gemma 3 4B it: strong for its size, sliding-window attention; 128k context",
    ),
    CuratedModel(
        "Qwen/Qwen3-4B-GGUF",
        "apache-2.0",
        "Qwen3 4B: chat with an optional thinking mode; 32k context",
    ),
    CuratedModel(
        "bartowski/Qwen2.5-7B-Instruct-GGUF",
        "apache-2.0",
        "Qwen2.5 7B Instruct: a capable all-rounder for 8 GB and more; 32k context",
    ),
    CuratedModel(
        "bartowski/Mistral-7B-Instruct-v0.3-GGUF",
        "apache-2.0",
        "Mistral 7B Instruct v0.3: a well-known 7B chat model; 32k context",
    ),
)
