"""Test files handed to the xdist workers longest first, so that the two finish together.

`make test` runs whole files per worker (`--dist loadfile`). pytest-xdist hands the files out in
collection order, which it first sorts by how many tests each file has: a file of a few slow
tests (the benchmarks, a real window, a server switch) then starts last, and one worker runs it
alone while the other has nothing left. Longest processing time first keeps that tail short:
the controller orders the files by their seconds, from the last complete run of each file
(pytest's cache, which the controller updates at the end of every run) or else the figures in
`SEED_SECONDS` (measured on the 2-core machine), and hands the order to every worker, so all of
them collect the same order even while another run rewrites the cache. A file of unknown cost
counts `UNKNOWN_SECONDS_PER_TEST` per test. A serial run keeps pytest's own order.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

CACHE_KEY = "kvscope/file_seconds"
ORDER_KEY = "kvscope_file_order"  # in each xdist worker's workerinput
UNKNOWN_SECONDS_PER_TEST = 1.0
# CPU seconds of each file run alone (`pytest -p no:xdist`) on the 2-core machine, the session's
# model loads included (in `make test` only a worker's first file pays them); the AOT compiles'
# figure is their wall time on one worker. Only the order matters: a rough figure in the right
# place is enough, and a run's own figures replace these in the cache.
SEED_SECONDS: dict[str, float] = {
    "tests/test_triton_aot.py": 190.0,
    "tests/test_bench.py": 65.0,
    "tests/test_parity_hf.py": 49.0,
    "tests/test_engine.py": 49.0,
    "tests/test_forking.py": 48.0,
    "tests/test_vllm_sampling.py": 45.0,
    "tests/test_vllm_kv_events.py": 40.0,
    "tests/test_app_chat.py": 36.0,
    "tests/test_quant_weights.py": 36.0,
    "tests/test_fp8_kv.py": 36.0,
    "tests/test_kv_snapshot.py": 36.0,
    "tests/test_model_loading.py": 32.0,
    "tests/test_vllm_sampling_behaviour.py": 30.0,
    "tests/test_window_layout.py": 30.0,
    "tests/test_cpu_gemv.py": 29.0,
    "tests/test_window_habits.py": 28.0,
    "tests/test_app_responsiveness.py": 27.0,
    "tests/test_truthful_numbers.py": 26.0,
    "tests/test_bench_models.py": 18.0,
    "tests/test_per_chat_sampling.py": 15.0,
    "tests/test_system_prompt_edit.py": 14.0,
    "tests/test_chat_recovery.py": 13.0,
    "tests/test_real_window.py": 11.0,
    "tests/test_vllm_metrics.py": 10.0,
    "tests/test_cpu_fused_decode.py": 9.0,
    "tests/test_kernels_triton.py": 37.0,
    "tests/test_cli.py": 32.0,
    "tests/test_bench_gpu.py": 26.0,
    "tests/test_serve_schemathesis.py": 26.0,
    "tests/test_replay_view.py": 25.0,
    "tests/test_kernels_quant.py": 22.0,
    "tests/test_app_settings.py": 21.0,
    "tests/test_serve_api.py": 20.0,
    "tests/test_serve_app_switch.py": 19.0,
    "tests/test_contiguous.py": 18.0,
    "tests/test_hostile_models.py": 17.0,
    "tests/test_remote_view.py": 16.0,
    "tests/test_context_meter.py": 16.0,
    "tests/test_serve_hostile_requests.py": 15.0,
    "tests/test_serve_connections.py": 12.0,
}


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _seconds(config: pytest.Config) -> dict[str, float]:
    cached = config.cache.get(CACHE_KEY, {}) if getattr(config, "cache", None) else {}
    return {**SEED_SECONDS, **cached}


def longest_first(files_and_counts: dict[str, int], seconds: dict[str, float]) -> list[str]:
    """The files, longest first; ties (and unknown files of one size) keep their given order."""

    def cost(item: tuple[int, str]) -> float:
        index, name = item
        return seconds.get(name, files_and_counts[name] * UNKNOWN_SECONDS_PER_TEST)

    ranked = sorted(enumerate(files_and_counts), key=lambda item: (-cost(item), item[0]))
    return [name for _, name in ranked]


class FileOrder:
    """The controller side: the order for the workers, and each file's seconds for the cache."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds = _seconds(config)
        self.collected: dict[str, set[str]] = {}
        self.reported: dict[str, set[str]] = defaultdict(set)
        self.spent: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        # The order itself is decided in the workers, from the items they collect; what they
        # need is the same figures, read once here.
        node.workerinput[ORDER_KEY] = self.seconds

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        self._collected(ids)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self._collected([item.nodeid for item in items])  # a serial run: nothing reordered

    def _collected(self, ids: list[str]) -> None:
        if self.collected:
            return
        for nodeid in ids:
            self.collected.setdefault(_file_of(nodeid), set()).add(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = _file_of(report.nodeid)
        self.spent[name] += report.duration
        self.reported[name].add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None:
            return
        if not _whole_files(self.config):
            return  # a part of a file is no figure for the file
        # Only files whose every collected test ran (not one cut short by -x or a crash).
        complete = {
            name: round(self.spent[name], 1)
            for name, ids in self.collected.items()
            if ids and ids <= self.reported[name]
        }
        if complete:
            cache.set(CACHE_KEY, {**cache.get(CACHE_KEY, {}), **complete})


def _whole_files(config: pytest.Config) -> bool:
    """Whether the run selects whole files: no -k, -m, --deselect, --lf, --sw, no test ids."""
    option = config.option
    narrowed = ("keyword", "markexpr", "deselect", "lf", "stepwise")
    if any(getattr(option, name, None) for name in narrowed):
        return False
    return not any("::" in arg for arg in config.args)


def reorder(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort `items` in place by file, longest file first; each file's own order kept."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(_file_of(item.nodeid), []).append(item)
    counts = {name: len(file_items) for name, file_items in by_file.items()}
    items[:] = [item for name in longest_first(counts, seconds) for item in by_file[name]]


def configure(config: pytest.Config) -> None:
    """Register the controller's side, or remember a worker's figures for its collection."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        config.pluginmanager.register(FileOrder(config), "kvscope-file-order")
        if hasattr(config.option, "loadscopereorder"):
            # xdist would sort the workers' collection by test count again: keep ours.
            config.option.loadscopereorder = False
    elif ORDER_KEY in workerinput:
        config.stash[_WORKER_SECONDS] = workerinput[ORDER_KEY]


_WORKER_SECONDS = pytest.StashKey[dict]()


def modify_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the files longest first (the controller hands them out in order)."""
    seconds = config.stash.get(_WORKER_SECONDS, None)
    if seconds is not None:
        reorder(items, seconds)
