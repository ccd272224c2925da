"""The CPU thread policy: the default, the knob, where it is applied, and the benches around it."""

import pytest
import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.cpu_threads import (
    MAX_DEFAULT_THREADS,
    apply_num_threads,
    default_num_threads,
    physical_cores,
)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """torch's thread count is per process: leave it as the test found it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _fake_topology(root, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return root


def test_smt_siblings_count_as_one_core(tmp_path):
    # 4 logical CPUs, two cores with two hyperthreads each.
    sysfs = _fake_topology(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores([0, 1, 2, 3], sysfs) == 2
    assert physical_cores([0, 2], sysfs) == 1  # an affinity mask of one core's two threads


def test_without_topology_every_logical_cpu_counts(tmp_path):
    assert physical_cores([0, 1, 2], tmp_path) == 3


@pytest.mark.parametrize(
    ("cores", "threads"), [(1, 1), (2, 1), (4, 3), (8, 7), (64, MAX_DEFAULT_THREADS)]
)
def test_default_leaves_one_core_free(cores, threads):
    assert default_num_threads(cores) == threads


def test_apply_sets_torch_threads_and_rejects_zero():
    assert apply_num_threads(1) == 1
    assert torch.get_num_threads() == 1
    assert apply_num_threads(None) == default_num_threads()
    assert torch.get_num_threads() == default_num_threads()
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        apply_num_threads(0)


def test_config_validates_num_threads():
    with pytest.raises(ValueError, match="num_threads must be >= 1.*got 0"):
        EngineConfig(num_threads=0)
    assert EngineConfig(num_threads=3).num_threads == 3


def test_engine_applies_the_knob_and_reports_it(default_model):
    from kvscope.engine import LLM

    llm = LLM(
        model=default_model, device="cpu", dtype="float32", num_threads=1, kv_cache_memory=16 << 20
    )
    assert torch.get_num_threads() == 1
    assert llm.stats()["num_threads"] == 1
    # The worker thread the app steps the engine on inherits the count.
    import threading

    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    worker.start()
    worker.join()
    assert seen == [1]


def test_settings_carry_threads_to_the_engine(qtbot):
    from kvscope.app.core.settings import AppSettings, EngineSettings
    from kvscope.app.desktop.settings.dialog import SettingsDialog

    assert EngineSettings(num_threads=3).llm_kwargs()["num_threads"] == 3
    assert EngineSettings().llm_kwargs()["num_threads"] is None
    with pytest.raises(ValueError, match="num_threads"):
        AppSettings(engine=EngineSettings(num_threads=0)).validate()
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(device="cpu")))
    qtbot.addWidget(dialog)
    assert dialog.engine_settings().num_threads is None  # "automatic (N)" reads back as None
    assert dialog.threads.specialValueText() == f"automatic ({default_num_threads()})"
    dialog.threads.setValue(1)
    assert dialog.engine_settings().num_threads == 1


def test_thread_sweep_covers_one_the_default_and_the_cores():
    from kvscope.app.bench.threads_bench import thread_counts

    assert thread_counts(default=1, cpus=2) == [1, 2]
    assert thread_counts(default=7, cpus=8) == [1, 2, 3, 4, 7]


def test_peer_bench_says_when_the_peer_is_absent(tmp_path, monkeypatch):
    from kvscope.app.bench.llama_cpp import peer_bench

    monkeypatch.setattr(peer_bench, "llama_cpp_version", lambda: None)
    report = peer_bench.run_peer_bench(tmp_path, num_prompts=1, max_tokens=4, threads=1, rounds=1)
    assert report["peer"] is None
    assert "llama.cpp is not installed" in report["peer_missing"]
    assert "make peer" in report["peer_missing"]  # the build recipe comes with it
    ours = report["kvscope"]
    assert ours["requests"] == 1 and ours["decode_tokens_per_s"] > 0
    assert ours["per_request"][0]["prompt_tokens"] > 0
    assert (tmp_path / "bench_peer.json").exists() and (tmp_path / "bench_peer.png").exists()
    assert "not installed" in peer_bench.summarize_peer(report)
    with pytest.raises(ValueError, match="peer 'vllm' is not one of"):
        peer_bench.run_peer_bench(tmp_path, peer="vllm")


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is an optional benchmark dependency (README: the peer benchmark)",
)
def test_peer_bench_runs_llama_cpp_on_the_same_tokens(tmp_path):
    from kvscope.app.bench.llama_cpp import peer_bench

    report = peer_bench.run_peer_bench(tmp_path, num_prompts=1, max_tokens=6, threads=1, rounds=1)
    peer = report["peer"]
    assert peer["name"] == "llama.cpp" and peer["decode_tokens_per_s"] > 0
    assert (
        peer["per_request"][0]["prompt_tokens"]
        == report["kvscope"]["per_request"][0]["prompt_tokens"]
    )
    # Greedy on the same Q4 weights: the first tokens agree (arithmetic differs in rounding).
    assert report["greedy_tokens_agreeing"][0] >= 1
