"""Ollama's models, by the name and tag a user pulled them as ("llama3.2:1b").

Ollama stores a model as a manifest, `<models>/manifests/<host>/<namespace>/<model>/<tag>`, a
JSON object whose "layers" list names blobs by digest; the layer with media type
`application/vnd.ollama.image.model` is the GGUF file, kept as `<models>/blobs/sha256-<hex>`
(ollama/ollama: server/manifest.go globs manifests/*/*/*/*, GetBlobsPath turns "sha256:<hex>"
into that file name, envconfig.Models() is $OLLAMA_MODELS or ~/.ollama/models). Names are shown
as Ollama shows them: the default host and the "library" namespace left out. Reading is bounded
(count, manifest size, time) and skips what is missing or malformed; a blob is then described
from its GGUF header like any other file.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")  # what Ollama's GetBlobsPath accepts
MAX_MANIFESTS = 200
MAX_MANIFEST_BYTES = 1 << 20  # real ones are under 2 KiB
SCAN_BUDGET_S = 1.0


@dataclass(frozen=True)
class OllamaModel:
    name: str  # "gemma3:270m"; the tags of one blob joined: "llama3.2:1b, llama3.2:latest"
    blob: Path  # <models>/blobs/sha256-<hex>, a GGUF file
    size_bytes: int


def ollama_models_dir(home: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """$OLLAMA_MODELS (trimmed of spaces and quotes, as Ollama reads it), else ~/.ollama/models."""
    env = os.environ if environ is None else environ
    override = env.get("OLLAMA_MODELS", "").strip().strip("\"'")
    if override:
        return Path(override).expanduser()
    return (home or Path.home()) / ".ollama" / "models"


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's shortest form: "gemma3:270m", "someone/model:tag", "hf.co/org/repo:Q4_K_M"."""
    if host == DEFAULT_HOST:
        base = model if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}"
    else:
        base = f"{host}/{namespace}/{model}"
    return f"{base}:{tag}"


def model_blob(manifest_path: Path, models_dir: Path) -> Path | None:
    """The GGUF blob a manifest names, if the manifest is readable and the blob is there."""
    try:
        if manifest_path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable or not JSON (UnicodeDecodeError is a ValueError)
        return None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if not isinstance(layer, dict) or layer.get("mediaType") != MODEL_MEDIA_TYPE:
            continue
        match = DIGEST.match(str(layer.get("digest", "")))
        if match is None:
            return None
        blob = models_dir / "blobs" / f"sha256-{match.group(1)}"
        return blob if blob.is_file() else None  # a pull that did not finish, or pruned
    return None


def ollama_models(models_dir: Path, budget_s: float = SCAN_BUDGET_S) -> list[OllamaModel]:
    """Every pulled model whose blob is present, sorted by name; tags of one blob share a row."""
    deadline = time.monotonic() + budget_s
    manifests = models_dir / "manifests"
    by_blob: dict[Path, list[str]] = {}
    sizes: dict[Path, int] = {}
    seen = 0
    for path in sorted(_manifest_files(manifests)):
        if seen >= MAX_MANIFESTS or time.monotonic() > deadline:
            break
        seen += 1
        blob = model_blob(path, models_dir)
        if blob is None:
            continue
        try:
            key, size = blob.resolve(), blob.stat().st_size
        except (OSError, RuntimeError):
            continue
        host, namespace, model, tag = path.relative_to(manifests).parts
        by_blob.setdefault(key, []).append(display_name(host, namespace, model, tag))
        sizes[key] = size
    found = [OllamaModel(", ".join(names), blob, sizes[blob]) for blob, names in by_blob.items()]
    return sorted(found, key=lambda m: m.name.lower())


def _manifest_files(manifests: Path) -> list[Path]:
    """manifests/<host>/<namespace>/<model>/<tag> files, as Ollama's own glob finds them."""
    try:
        return [p for p in manifests.glob("*/*/*/*") if p.is_file()]
    except OSError:
        return []


def name_of_blob(path: str | os.PathLike) -> str:
    """Ollama's name for a blob (…/blobs/sha256-<hex>) from the manifests beside it; "" for any
    other file, or a blob no manifest names."""
    path = Path(path)
    if path.parent.name != "blobs" or DIGEST.match(path.name) is None:
        return ""
    try:
        wanted = path.resolve()
    except (OSError, RuntimeError):
        return ""
    for model in ollama_models(path.parent.parent):
        if model.blob == wanted:
            return model.name
    return ""
