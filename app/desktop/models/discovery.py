"""Find the GGUF files a user already has: the folders LM Studio, GPT4All and Jan download into,
~/models, the Hugging Face cache (what `kvscope pull`, the Get a model window, huggingface_hub
and llama.cpp's `-hf` downloaded: app/core/hub/cache_layout.py), Ollama's models
(app/desktop/models/ollama.py) and the models this app opened before.

Users of those apps keep gigabytes of models there and expect a picker to list them. The scan
walks folders only (no file is opened), bounded in depth, count and time, skips what it cannot
read and never enters a folder twice, so a symlink loop ends. `describe` then reads one file's
GGUF header (never its weights) for its quantization: the file's own general.file_type, not a
guess from the tensors (engine/model/gguf/identity.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.app.desktop.models.ollama import ollama_models, ollama_models_dir
from kvscope.engine.model.gguf.identity import is_gguf_file
from kvscope.engine.model.gguf.split import split_part_number

MAX_DEPTH = 6  # LM Studio: models/<publisher>/<repo>/<file>.gguf; a little room beyond
MAX_FILES = 200
SCAN_BUDGET_S = 2.0
MAX_RECENT = 10
RECENT_FILE = "recent_models.json"
HUB_CACHE_LABEL = "Hugging Face"


@dataclass(frozen=True)
class SearchRoot:
    label: str  # the app that keeps models there, shown next to each file
    path: Path


@dataclass(frozen=True)
class FoundModel:
    path: Path
    size_bytes: int
    source: str  # SearchRoot.label, "Ollama", or "Recent"
    name: str = ""  # what the user calls it when the file name does not say (Ollama's tag)

    @property
    def title(self) -> str:
        return self.name or self.path.name


@dataclass(frozen=True)
class ModelSummary:
    """What the picker's list shows about one file, from its header alone."""

    name: str  # general.name, else the file name
    quantization: str  # the file's own type ("Q4_K_M"), else its layers' ("Q4_K"); "" unreadable
    error: str = ""
    details: str = ""  # where the quantization came from and the name fields, for a tooltip


def search_roots(home: Path | None = None) -> list[SearchRoot]:
    """The usual model folders on this platform, whether or not they exist."""
    home = home or Path.home()
    roots = [
        SearchRoot("LM Studio", home / ".lmstudio" / "models"),
        SearchRoot("LM Studio", home / ".cache" / "lm-studio" / "models"),
        SearchRoot("Models folder", home / "models"),
        SearchRoot("Jan", home / "jan" / "models"),
    ]
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            roots.append(SearchRoot("GPT4All", Path(local) / "nomic.ai" / "GPT4All"))
    elif sys.platform == "darwin":
        roots.append(
            SearchRoot("GPT4All", home / "Library" / "Application Support" / "nomic.ai" / "GPT4All")
        )
    else:
        roots.append(SearchRoot("GPT4All", home / ".local" / "share" / "nomic.ai" / "GPT4All"))
    return roots


def find_gguf_files(
    roots: list[SearchRoot],
    max_depth: int = MAX_DEPTH,
    max_files: int = MAX_FILES,
    budget_s: float = SCAN_BUDGET_S,
) -> list[FoundModel]:
    """Every *.gguf under the roots, breadth first, until a bound is reached."""
    deadline = time.monotonic() + budget_s
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[Path] = set()
    found: list[FoundModel] = []
    for root in roots:
        queue = [(root.path, 0)]
        while queue and len(found) < max_files and time.monotonic() < deadline:
            folder, depth = queue.pop(0)
            for entry in _entries(folder, seen_dirs):
                if len(found) >= max_files:
                    break
                model = _as_model(entry, root.label, seen_files)
                if model is not None:
                    found.append(model)
                elif depth + 1 < max_depth and _is_dir(entry):
                    queue.append((Path(entry.path), depth + 1))
    return found


def _entries(folder: Path, seen_dirs: set[tuple[int, int]]) -> list[os.DirEntry]:
    """The folder's entries, or none if it is unreadable or was already walked."""
    try:
        info = folder.stat()
        if (info.st_dev, info.st_ino) in seen_dirs:
            return []
        seen_dirs.add((info.st_dev, info.st_ino))
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name.lower())
    except OSError:
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _as_model(entry: os.DirEntry, source: str, seen: set[Path]) -> FoundModel | None:
    if not entry.name.lower().endswith(".gguf"):
        return None
    part = split_part_number(entry.name)
    if part is not None and part[0] != 1:
        return None  # a split model is listed once, by its first part, which opens it whole
    try:
        if not entry.is_file():
            return None
        real = Path(entry.path).resolve()
        size = entry.stat().st_size if part is None else _split_size(Path(entry.path), part[1])
    except (OSError, RuntimeError):  # RuntimeError: resolve() of a symlink loop
        return None
    if real in seen:
        return None
    seen.add(real)
    return FoundModel(Path(entry.path), size, source)


def _split_size(first: Path, count: int) -> int:
    """Bytes of the parts present beside a split model's first part (its other parts share
    the first's name but for the number)."""
    stem = first.name[: -len("-00001-of-00000.gguf")]
    parts = (first.with_name(f"{stem}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1))
    return sum(p.stat().st_size for p in parts if p.is_file())


def describe(path: Path) -> ModelSummary:
    """Name and quantization from the GGUF header; an unreadable file says why instead."""
    from kvscope.engine.model.gguf.summary import summarize_gguf

    try:
        summary = summarize_gguf(path)
    except Exception as e:  # any file from anywhere: a row that says why, never a crash
        return ModelSummary(path.name, "", f"{type(e).__name__}: {e}")
    fields = (f"{k}: {v}" for k, v in summary.names.items())
    details = "\n".join([f"Quantization: {summary.why}", *fields])
    return ModelSummary(summary.name, summary.quantization, details=details)


# ---- recently opened models, kept in the data dir ---------------------------------------------
def recent_models(data_dir: Path) -> list[Path]:
    """Models opened before, newest first; a missing or damaged list is an empty one."""
    try:
        entries = json.loads((data_dir / RECENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(entries, list):
        return []
    return [Path(e) for e in entries if isinstance(e, str)][:MAX_RECENT]


def remember_model(data_dir: Path, model: str | os.PathLike) -> None:
    """Put `model` first in the recent list (best effort: a read-only data dir keeps none)."""
    path = str(Path(model).expanduser().absolute())
    entries = [str(p) for p in recent_models(data_dir) if str(p) != path]
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / RECENT_FILE).write_text(
            json.dumps([path, *entries][:MAX_RECENT], indent=1), encoding="utf-8"
        )
    except OSError:
        pass


def recent_gguf_files(data_dir: Path, names: dict[Path, str] | None = None) -> list[FoundModel]:
    """The recent list's GGUF files that still exist (an Ollama blob by its magic), named from
    `names` (resolved path -> Ollama's tag) where the file name is a hash."""
    found = []
    for path in recent_models(data_dir):
        try:
            if is_gguf_file(path):
                name = (names or {}).get(path.resolve(), "")
                found.append(FoundModel(path, path.stat().st_size, "Recent", name))
        except (OSError, RuntimeError):  # RuntimeError: resolve() of a symlink loop
            continue
    return found


def hub_cache_models() -> list[FoundModel]:
    """The model GGUFs in the Hugging Face cache (HF_HUB_CACHE), a split model by its first
    part; only verified files are ever there (partial downloads have another name)."""
    # Imported here: the scan thread pays for huggingface_hub's import, not the app's start.
    from kvscope.app.core.hub.pull import cached_ggufs

    found = []
    for path in cached_ggufs():
        try:
            found.append(FoundModel(path, path.stat().st_size, HUB_CACHE_LABEL))
        except OSError:
            continue
    return found


def discover(
    data_dir: Path, home: Path | None = None, environ: dict[str, str] | None = None
) -> list[FoundModel]:
    """Recent models first, then the usual folders, the Hugging Face cache, then Ollama's;
    each file once."""
    pulled = ollama_models(ollama_models_dir(home, environ))
    ollama = [FoundModel(m.blob, m.size_bytes, "Ollama", m.name) for m in pulled]
    recent = recent_gguf_files(data_dir, {m.path.resolve(): m.name for m in ollama})
    known = {m.path.resolve() for m in recent}
    scanned = []
    for model in [*find_gguf_files(search_roots(home)), *hub_cache_models(), *ollama]:
        if model.path.resolve() not in known:
            known.add(model.path.resolve())
            scanned.append(model)
    return recent + scanned
