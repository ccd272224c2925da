"""Test-wide environment: offscreen Qt, no hub access, user data in a temp dir."""

import gc
import os
import tempfile

# Set before anything imports Qt, transformers or triton.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")
# Child Pythons the tests start (`-c`, `-m`, scripts) leave the working directory off their import
# path: run from the checkout, its kernels/ would shadow Hugging Face's `kernels` (Python 3.11+).
os.environ.setdefault("PYTHONSAFEPATH", "1")
os.environ.setdefault("KVSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="kvscope-test-"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist workers inherit the controller's environment, data dir included: give each its own
    # settings, chats and cache, so that two tests at once never share a file.
    worker = os.environ["PYTEST_XDIST_WORKER"]
    os.environ["KVSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix=f"kvscope-test-{worker}-")
# numba's compiled CPU kernels (kernels/cpu_gemv.py) outlive a session's temp data dir: compiling
# them takes 20-45 s here. One folder per version of their sources, as the app keeps them
# (cpu_gemv.cache_dir says why numba's own check is not enough).
os.environ.setdefault(
    "KVSCOPE_NUMBA_CACHE", os.path.join(tempfile.gettempdir(), "kvscope-test-numba-cache")
)


import pytest  # noqa: E402


def _share_the_cores_between_xdist_workers() -> None:
    """`make test` runs the suite on pytest-xdist workers, one process each. torch gives every
    process one thread per core, so two workers on two cores would each spin two threads at
    every op's barrier against the other worker: give each worker its share of the cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        torch.set_num_threads(max(1, (cores or 1) // workers))


_share_the_cores_between_xdist_workers()


@pytest.fixture(scope="session")
def default_model_lazy():
    """The bundled model as `load_model` returns it: header and tokenizer, weights on disk."""
    from kvscope.engine.model.loader import load_model

    return load_model(None)


@pytest.fixture(scope="session")
def default_model(default_model_lazy):
    """The bundled model dequantized to float32 once per test session: the exact reference
    path, which LLM(model=...) builds from without reading the file again."""
    return default_model_lazy.materialized("none")


@pytest.fixture(scope="session")
def hf_default():
    """HF transformers' own load of the bundled GGUF in float32: the parity reference, and the
    baseline `kvscope bench` loads (tests/app/bench/test_bench.py), so it is loaded once per
    session."""
    from kvscope.app.bench.hf_baseline import load_hf_model

    return load_hf_model()


@pytest.fixture(scope="session")
def default_llm(default_model):
    """A default-configured engine shared by tests that leave it as they found it."""
    from kvscope.engine import LLM

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
    from kvscope.app.core.settings import AppSettings, EngineSettings, SamplingSettings
    from kvscope.app.desktop.window import MainWindow

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
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    for window in windows:
        window.close()
        # A closed window is not freed: its actions' and timers' connected slots (lambdas and
        # bound methods of the window) are held from the C++ side, which Python's collector
        # cannot see through. Left alive, every later window test carries them all, and each
        # stylesheet change re-polishes every one of them.
        window.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    # Collect the closed windows' Qt objects here, on the GUI thread, rather than whenever the
    # next test's engine thread happens to trigger a collection.
    gc.collect()


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A loopback Hub (tests/fake_hub.py) that this process's huggingface_hub (and our hub
    code) uses, with its cache in `tmp_path/hf`."""
    from fake_hub import FakeHub, point_huggingface_hub_at

    with FakeHub() as hub:
        point_huggingface_hub_at(hub, tmp_path / "hf", monkeypatch)
        yield hub


@pytest.fixture
def hf_cache(tmp_path, fake_hub):
    """The HF_HUB_CACHE the fake_hub fixture set up."""
    return tmp_path / "hf" / "hub"
