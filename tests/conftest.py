"""Test-wide environment: offscreen Qt, no hub access, user data in a temp dir."""

import gc
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
def default_model_lazy():
    """The bundled model as `load_model` returns it: header and tokenizer, weights on disk."""
    from engine.model.loader import load_model

    return load_model(None)


@pytest.fixture(scope="session")
def default_model(default_model_lazy):
    """The bundled model dequantized to float32 once per test session: the exact reference
    path, which LLM(model=...) builds from without reading the file again."""
    return default_model_lazy.materialized("none")


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


@pytest.fixture()
def make_window(qtbot, default_model, tmp_path):
    """MainWindow factory on the preloaded model, a small CPU pool and a per-test chats DB.

    Keyword arguments set engine knobs (block_size=32) or sampling (max_tokens=4). Waits until
    the engine is up."""
    from app.settings import AppSettings, EngineSettings, SamplingSettings
    from app.window import MainWindow

    engine_keys = {f for f in EngineSettings.__dataclass_fields__}
    windows = []

    def make(**overrides):
        engine = {"device": "cpu", "dtype": "float32", "kv_budget_mib": 32}
        sampling = {"max_tokens": 6, "temperature": 0.0}
        for key, value in overrides.items():
            (engine if key in engine_keys else sampling)[key] = value
        settings = AppSettings(
            engine=EngineSettings(**engine), sampling=SamplingSettings(**sampling)
        )
        window = MainWindow(
            settings=settings,
            loaded_model=default_model,
            store_path=tmp_path / "chats.sqlite3",
            persist_settings=False,
        )
        windows.append(window)  # qtbot holds widgets weakly; the engine thread must be shut
        window.show()
        qtbot.waitUntil(lambda: window.engine_info is not None, timeout=120_000)
        return window

    yield make
    for window in windows:
        window.close()
    # Collect the closed windows' Qt objects here, on the GUI thread, rather than whenever the
    # next test's engine thread happens to trigger a collection.
    gc.collect()
