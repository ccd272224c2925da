"""Test-wide environment: offscreen Qt, no hub access, user data in a temp dir."""

import os
import tempfile

# Set before anything imports Qt, transformers or triton.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KVSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="kvscope-test-"))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_model():
    """The bundled model, read once per test session (LLM(model=...) reuses it)."""
    from engine.model.loader import load_model

    return load_model(None)


@pytest.fixture(scope="session")
def hf_default():
    """HF transformers' own load of the bundled GGUF in float32: the parity reference."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.model.loader import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def default_llm(default_model):
    """A default-configured engine shared by tests that leave it as they found it."""
    from engine import LLM

    return LLM(model=default_model, device="cpu", dtype="float32", kv_cache_memory=256 << 20)


@pytest.fixture(scope="session")
def chat_prompts():
    import json
    from pathlib import Path

    workload = json.loads((Path(__file__).parent.parent / "assets" / "chat_mixed.json").read_text())
    return [c["messages"][-1]["content"] for c in workload["chat"]]
