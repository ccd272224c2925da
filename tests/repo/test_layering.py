"""The app reaches the engine and the kernels only through their public surface.

Which way imports go (app -> engine -> kernels, never back) and that engine and kernels have no
import cycles are import-linter's contracts in pyproject.toml (`make lint`,
tests/repo/test_import_contracts.py). What import-linter cannot say is which *names* of a module
are public, so that stays here: every import in app/**/*.py of an engine or kernels module is
checked against the public set below (an `import kernels` also by the attributes read off
it). Anything else is an engine internal: a benchmark that needs one belongs in
`engine.bench`, a fact the app needs gets a public accessor.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from repo_paths import REPO as ROOT

# Module -> the names the app may import from it (None: any).
ENGINE_PUBLIC: dict[str, set[str] | None] = {
    "kvscope.engine": None,  # LLM, SamplingParams, BeamSearchParams, EngineConfig, outputs
    "kvscope.engine.config": None,  # the knob list the settings and the CLI are derived from
    # The settings' thread row; the bench's thread sweep.
    "kvscope.engine.cpu_threads": {
        "default_num_threads",
        "usable_cpus",
        "apply_num_threads",
        "physical_cores",  # the peer table's thread counts: 1, 2, every physical core
    },
    "kvscope.engine.sizing.planner": None,
    # a child Python running one of our modules
    "kvscope.engine.child_python": {"python_module_command", "SAFE_PATH_FLAGS"},
    # The worker's CPU kernels: loaded when compiled, else compiled in the background.
    "kvscope.engine.cpu_kernels": {
        "prepare_cpu_kernels",
        "kernels_wanted",
        "kernels_compiled",
        "BackgroundCompile",
    },
    "kvscope.engine.memory.device_memory": None,
    "kvscope.engine.kv.snapshot": None,  # KVSnapshot and its parts, what the block map draws
    "kvscope.engine.model.loader": {"load_model", "default_model_path", "LoadedModel"},
    # what engine.sizing.planner.model_config returns
    "kvscope.engine.model.model_config": {"ModelConfig"},
    # The picker: a GGUF known by its magic (Ollama's blobs), and its header's name and type.
    "kvscope.engine.model.gguf.identity": {"is_gguf_file"},
    "kvscope.engine.model.gguf.summary": {"summarize_gguf", "GGUFSummary"},
    # A base model's chats: whether its template is the plain transcript, and where it stops.
    "kvscope.engine.model.templates.fallbacks": {"is_completion_template", "COMPLETION_STOP"},
    "kvscope.engine.memory.host_memory": {
        "give_back_freed"
    },  # after a rebuild drops the old engine
    # the weights' cost and fit before loading, for the dialog
    "kvscope.engine.sizing.weight_fit": None,
    "kvscope.engine.kv.replay": {"replay_events"},  # a recording back into snapshots
    # the engine's traffic trace (LLMEngine.trace), what a what-if replays
    "kvscope.engine.trace": None,
    # the what-if simulator, sweeps and the pool at a step (What-if tab)
    "kvscope.engine.whatif": None,
    # `from kvscope.engine.whatif import simulate, sweep` imports the functions, which share their
    # modules' names (the check would take them for those modules)
    "kvscope.engine.whatif.simulate": {"simulate"},
    "kvscope.engine.whatif.sweep": {"sweep"},
}
ENGINE_BENCH = "kvscope.engine.bench"  # the engine's own benchmarks, for `kvscope bench`
KERNELS_PUBLIC = {
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_kv",
    "quantized_matmul",
}


def _module_of(parent: str, name: str) -> str | None:
    """`parent.name` when `from parent import name` imports a submodule, else None."""
    try:
        return f"{parent}.{name}" if importlib.util.find_spec(f"{parent}.{name}") else None
    except ModuleNotFoundError:
        return None


def _ours(module: str) -> bool:
    return module.split(".")[:2] in (["kvscope", "engine"], ["kvscope", "kernels"])


def _public(module: str, name: str | None) -> bool:
    if module == ENGINE_BENCH or module.startswith(ENGINE_BENCH + "."):
        return True
    if module == "kvscope.kernels":
        return name in KERNELS_PUBLIC
    if module not in ENGINE_PUBLIC:
        return False
    names = ENGINE_PUBLIC[module]
    return name is None or names is None or name in names


def _internal_imports(path: Path) -> set[tuple[str, str]]:
    """(module, what) for each import of an engine/kernels internal in one file."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, str]] = set()
    kernel_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name) and not _public(alias.name, None):
                    found.add((alias.name, "*"))
        elif isinstance(node, ast.ImportFrom) and node.module == "kvscope":
            for alias in node.names:
                if alias.name == "kernels":
                    kernel_aliases.add(alias.asname or "kernels")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module or ""):
            for alias in node.names:
                module = _module_of(node.module, alias.name)
                target, name = (module, None) if module else (node.module, alias.name)
                if not _public(target, name):
                    found.add((target, name or "*"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in kernel_aliases
            and node.attr not in KERNELS_PUBLIC
        ):
            found.add(("kvscope.kernels", node.attr))
    return found


def _app_internal_imports() -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(file, module) -> the internal names it imports from that module, over app/**/*.py."""
    found: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in sorted((ROOT / "app").rglob("*.py")):
        for module, name in _internal_imports(path):
            key = (path.relative_to(ROOT).as_posix(), module)
            found.setdefault(key, set()).add((module, name))
    return found


def test_app_imports_only_public_engine_and_kernels():
    found = _app_internal_imports()
    assert not found, (
        f"app imports engine/kernels internals: {found}; use the public API, move the "
        "code into engine.bench, or give the engine a public accessor"
    )


def test_the_check_sees_internal_imports(tmp_path):
    """The checker itself: each way of reaching an internal is caught, the public ones are not."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from kvscope import kernels\n"
        "import kvscope.engine.kv.events\n"
        "from kvscope.engine import LLM\n"
        "from kvscope.engine.kv import telemetry\n"
        "from kvscope.engine.kv.snapshot import KVSnapshot\n"
        "from kvscope.engine.model.loader import load_model, expected_weight_shapes\n"
        "from kvscope.engine.bench.snapshot_cost import measure_snapshot_cost\n"
        "from kvscope.kernels import store_kv\n"
        "from kvscope.kernels.triton_decode import decode_num_splits\n"
        "kernels.paged_decode_attention\n"
        "kernels.resolve_backend\n"
    )
    assert _internal_imports(source) == {
        ("kvscope.engine.kv.events", "*"),
        ("kvscope.engine.kv.telemetry", "*"),
        ("kvscope.engine.model.loader", "expected_weight_shapes"),
        ("kvscope.kernels.triton_decode", "decode_num_splits"),
        ("kvscope.kernels", "resolve_backend"),
    }
