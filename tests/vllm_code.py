"""vLLM's own code, from its released wheel, for the conformance tests (tests/test_vllm_*.py).

Where KVScope claims to speak vLLM (KV events, their replay, block hashes, metrics, sampling
fields), the tests judge it with vLLM's classes, not with our reading of its documents. vLLM
does not install on this machine (it wants a CUDA torch), so we take its wheel (`make
vllm-wheel` downloads it once into .cache/vllm/, `pip download vllm==VERSION --no-deps`), unpack
its Python sources next to it, and import the modules we need straight from those files:

- the `vllm` packages' `__init__`s are bypassed (they import torch, the model zoo and the
  platform probes): each package is an empty module whose `__path__` points at the unpacked
  folder, so its submodules load from vLLM's own files;
- the modules listed in REAL run unmodified;
- every other `vllm.*` module that those import is a stand-in whose attributes are inert
  placeholder classes: configs, loggers and platform helpers the code paths under test never
  call. A placeholder that *is* called where it matters makes the test fail, not pass.

Nothing of vLLM is copied into this repository: the suite reads it at test time."""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import logging
import re
import subprocess
import sys
import tarfile
import types
import urllib.request
import zipfile
from pathlib import Path

import pytest

VLLM_VERSION = "0.33.0"
# The source release on PyPI carries what the wheel leaves out: vLLM's example KV-event
# subscriber, the replay client of its own test suite, and the tool chat templates it ships
# (tests/app/serve/tools/test_vllm_tool_formats.py).
SDIST_INDEX = "https://pypi.org/simple/vllm/"
TOOL_TEMPLATES = tuple(
    f"examples/tool_chat_template_{name}.jinja"
    for name in (
        "hermes",
        "llama3.1_json",
        "llama3.2_json",
        "llama3.2_pythonic",
        "llama4_json",
        "llama4_pythonic",
        "mistral",
        "mistral_parallel",
        "gemma3_pythonic",
        "glm4",
        "qwen3coder",
    )
) + (
    # Qwen 3's and Qwen 3.5's own templates, which vLLM's template tests render.
    "rust/src/chat/tests/templates/qwen3.jinja",
    "rust/src/chat/tests/templates/qwen35.jinja",
)
SDIST_FILES = (
    "examples/features/kv_events/kv_events_subscriber.py",
    "tests/__init__.py",
    "tests/distributed/__init__.py",
    "tests/distributed/conftest.py",
    "tests/distributed/test_events.py",
    *TOOL_TEMPLATES,
)
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "vllm"

# The modules that run as vLLM ships them. Packages on the way to them are bypassed, not run.
REAL = frozenset(
    {
        "vllm.envs",
        "vllm.distributed.kv_events",
        "vllm.v1.core.kv_cache_utils",
        "vllm.utils.hashing",
        "vllm.v1.metrics.loggers",
        "vllm.v1.metrics.buckets",
        "vllm.v1.metrics.cache_hit_source",
        "vllm.v1.metrics.prometheus",
        "vllm.v1.metrics.stats",
        "vllm.v1.metrics.utils",
        "vllm.v1.engine",
        "vllm.sampling_params",
        "vllm.config.cache",
        "vllm.config.utils",
        "vllm.config.kv_events",
        # The OpenAI server's request models (tests/app/serve/test_vllm_sampling.py) and what they
        # build on.
        "vllm.exceptions",
        "vllm.entrypoints.serve.engine.protocol",
        "vllm.entrypoints.generate.base.protocol",
        "vllm.entrypoints.openai.chat_completion.protocol",
        "vllm.entrypoints.openai.completion.protocol",
        "vllm.entrypoints.serve.tokenize.protocol",
        # vLLM's tool-call parsers (tests/app/serve/tools/test_vllm_tool_formats.py).
        "vllm.tool_parsers.abstract_tool_parser",
        "vllm.tool_parsers.hermes_tool_parser",
        "vllm.tool_parsers.llama_tool_parser",
        "vllm.tool_parsers.tool_strict_level",
        "vllm.tool_parsers.utils",
        "vllm.utils.mistral",  # the Hermes parser's "is this a Mistral tokenizer?"
    }
)


def wheel() -> Path:
    """The cached wheel; downloaded here only when `make vllm-wheel` has not run."""
    found = sorted(CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE)]
        + [f"vllm=={VLLM_VERSION}"],
        capture_output=True,
        text=True,
    )
    found = sorted(CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if not found:
        pytest.fail(f"cannot download vllm=={VLLM_VERSION}'s wheel: {done.stderr[-2000:]}")
    return found[0]


def source_root() -> Path:
    """vLLM's Python sources unpacked from the wheel (once per wheel)."""
    target = CACHE / f"src-{VLLM_VERSION}"
    marker = target / ".unpacked"
    if not marker.exists():
        with zipfile.ZipFile(wheel()) as whl:
            for name in whl.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    whl.extract(name, target)
        marker.write_text(VLLM_VERSION)
    return target


def sdist_root() -> Path:
    """vLLM's source release, the files of SDIST_FILES unpacked (downloaded once from PyPI,
    checked against the sha256 its index states); a file added to the list is unpacked on the
    next call."""
    target = CACHE / f"sdist-{VLLM_VERSION}"
    missing = [rel for rel in SDIST_FILES if not (target / rel).exists()]
    if not missing:
        return target
    archive = CACHE / f"vllm-{VLLM_VERSION}.tar.gz"
    if not archive.exists():
        fetch_sdist(archive)
    prefix = f"vllm-{VLLM_VERSION}/"
    with tarfile.open(archive) as tar:
        for rel in missing:
            member = tar.getmember(prefix + rel)
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")  # whole or absent, never half-written
            part.write_bytes(tar.extractfile(member).read())
            part.replace(out)
    return target


def fetch_sdist(archive: Path) -> None:
    name = archive.name
    try:
        with urllib.request.urlopen(SDIST_INDEX, timeout=60) as page:
            html = page.read().decode()
        found = re.search(rf'href="([^"]*/{re.escape(name)})#sha256=([0-9a-f]{{64}})"', html)
        if not found:
            pytest.fail(f"{name} is not listed at {SDIST_INDEX}")
        url, digest = found.groups()
        with urllib.request.urlopen(url, timeout=300) as reply:
            data = reply.read()
    except OSError as e:
        pytest.fail(f"cannot download {name} from PyPI: {e}")
    if hashlib.sha256(data).hexdigest() != digest:
        pytest.fail(f"{name} from {url} does not match the sha256 PyPI states")
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(data)


def sdist_file(rel: str) -> Path:
    return sdist_root() / rel


def vllm_test_module(rel: str) -> types.ModuleType:
    """A module of vLLM's own test suite (e.g. "tests/distributed/conftest.py"), imported as
    `vllm_tests.…` so that its relative imports resolve among vLLM's test files."""
    install()
    root = sdist_root() / "tests"
    parts = Path(rel).with_suffix("").parts
    assert parts[0] == "tests", rel
    for depth in range(1, len(parts)):
        name = ".".join(("vllm_tests",) + parts[1:depth])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*parts[1:depth]))]
            sys.modules[name] = package
    return importlib.import_module(".".join(("vllm_tests",) + parts[1:]))


class _Placeholder:
    """An inert stand-in for a vLLM name the code under test imports but does not use."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __class_getitem__(cls, item):
        return cls

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        # A pydantic model of vLLM's may name a stand-in as a field's type (a message part, a
        # logprob): that field takes any value. Field names and defaults stay vLLM's own.
        from pydantic_core import core_schema

        return core_schema.any_schema()


def _placeholder(module: str, name: str) -> type:
    return type(name, (_Placeholder,), {"__module__": module, "__qualname__": name})


class _StandIn(types.ModuleType):
    """A `vllm.*` module we do not run: any attribute is a placeholder class; `init_logger`
    is Python's logging, as vLLM's own is."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__ = []  # so that its submodules can be stand-ins too
        self.init_logger = logging.getLogger

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = _placeholder(self.__name__, attr)
        setattr(self, attr, value)
        return value


class _Bypassed(_StandIn):
    """A package whose `__init__` we do not run: its submodules load from vLLM's folder, and
    the names its `__init__` would have re-exported are placeholders."""

    def __init__(self, name: str, folder: Path) -> None:
        super().__init__(name)
        self.__path__ = [str(folder)]

    def __getattr__(self, attr: str):
        folder = Path(self.__path__[0])
        if (folder / f"{attr}.py").exists() or (folder / attr).is_dir():
            return importlib.import_module(f"{self.__name__}.{attr}")
        return super().__getattr__(attr)


class _Loader(importlib.abc.Loader):
    def __init__(self, make) -> None:
        self._make = make

    def create_module(self, spec):
        return self._make(spec.name)

    def exec_module(self, module) -> None:
        pass


class _VllmFinder(importlib.abc.MetaPathFinder):
    def __init__(self, src: Path) -> None:
        self.src = src

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        rel = Path(*fullname.split("."))
        folder, file = self.src / rel, (self.src / rel).with_suffix(".py")
        if fullname in REAL:
            init = folder / "__init__.py"
            if init.exists():  # a real package module (vllm.v1.engine): run its __init__
                return importlib.util.spec_from_file_location(
                    fullname, init, submodule_search_locations=[str(folder)]
                )
            return importlib.util.spec_from_file_location(fullname, file)
        if folder.is_dir() and any(
            name == fullname or name.startswith(fullname + ".") for name in REAL
        ):
            # A package on the way to a real module: its __init__ is not run.
            return importlib.machinery.ModuleSpec(
                fullname, _Loader(lambda name: _Bypassed(name, folder)), is_package=True
            )
        return importlib.machinery.ModuleSpec(fullname, _Loader(_StandIn), is_package=True)


def install() -> Path:
    """Make `import vllm.…` read the wheel's sources (idempotent); returns the source root."""
    src = source_root()
    if not any(isinstance(f, _VllmFinder) for f in sys.meta_path):
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _VllmFinder(src))
    return src


def module(name: str) -> types.ModuleType:
    """One of vLLM's modules, as its wheel ships it."""
    install()
    mod = importlib.import_module(name)
    if name in REAL:
        assert str(mod.__file__).startswith(str(CACHE)), mod.__file__
    return mod


if __name__ == "__main__":
    # `make vllm-wheel`: fetch and unpack both releases once, before the tests run.
    print(source_root(), sdist_root())
