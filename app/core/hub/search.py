"""Search the Hugging Face Hub for GGUF models, and judge each file against this machine.

`search_models` asks the hub for GGUF repos matching a query, most downloaded first
(`HfApi.list_models`), then each repo's tree for its files, sizes and LFS sha256
(`HfApi.list_repo_tree`), a few repos at a time. `judge_file` reads only the GGUF header of a
file (and of each part of a split one) with HTTP Range requests (app/core/hub/remote_file.py),
sizes the model with the engine's own code (engine.model.gguf.remote) and gives its verdict
(app/core/hub/fit_verdict.py). `judge_files` judges many at once on a small thread pool.
Everything goes through huggingface_hub, so HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from huggingface_hub import HfApi
from huggingface_hub.hf_api import ModelInfo, RepoFile

from kvscope.app.core.hub.curated import CURATED_MODELS
from kvscope.app.core.hub.fit_verdict import FitVerdict, fit_verdict, refused_verdict
from kvscope.app.core.hub.remote_file import RemoteFile
from kvscope.app.core.hub.search_errors import HubSearchError, check_online, hub_search_error
from kvscope.app.core.hub.search_files import TreeFile, model_files, quant_of
from kvscope.engine.config import EngineConfig
from kvscope.engine.model.gguf.remote import read_remote_gguf

__all__ = [
    "FitVerdict",
    "HubFile",
    "HubRepo",
    "HubSearchError",
    "curated_models",
    "judge_file",
    "judge_files",
    "list_files",
    "search_models",
]

SEARCH_FIELDS = ["downloads", "likes", "lastModified", "cardData", "tags"]
WORKERS = 4  # repos listed, or headers read, at once: polite to the hub, quick enough


@dataclass
class HubFile:
    repo: str
    file: str  # the file to pull: the first part of a split GGUF
    parts: list[str]  # every part in order; [file] for a single file
    quant: str | None  # from the file name ("Q4_K_M"); None when the name says none
    size_bytes: int  # all parts together
    sha256: str | None  # the hub's LFS sha256 of `file` (a split file's first part)
    verdict: FitVerdict | None = None


@dataclass
class HubRepo:
    repo: str
    downloads: int
    likes: int
    updated: str | None  # ISO 8601, as the hub gives it
    license: str | None
    files: list[HubFile]
    description: str | None = None


def search_models(query: str, limit: int = 20) -> list[HubRepo]:
    """GGUF repos matching `query`, most downloaded first, with their model files (no verdicts:
    judge_file reads headers, which takes longer)."""
    check_online()
    try:
        found = list(
            HfApi().list_models(
                search=query or None,
                filter="gguf",
                sort="downloads",
                limit=limit,
                expand=SEARCH_FIELDS,  # type: ignore[arg-type]  # a list of the hub's names
            )
        )
    except Exception as e:
        raise hub_search_error(e) from e
    with ThreadPoolExecutor(WORKERS) as pool:
        files = list(pool.map(list_files, [info.id for info in found]))
    return [_hub_repo(info, repo_files) for info, repo_files in zip(found, files, strict=True)]


def list_files(repo: str) -> list[HubFile]:
    """`repo`'s model files (split GGUFs as one, projectors left out), by path."""
    check_online()
    try:
        tree = [
            TreeFile(entry.path, entry.size, entry.lfs.sha256 if entry.lfs else None)
            for entry in HfApi().list_repo_tree(repo, recursive=True)
            if isinstance(entry, RepoFile)
        ]
    except Exception as e:
        raise hub_search_error(e, repo) from e
    return [
        HubFile(
            repo,
            model.path,
            [part.path for part in model.parts],
            quant_of(model.path),
            model.size,
            model.parts[0].sha256,
        )
        for model in model_files(tree)
    ]


def curated_models() -> list[HubRepo]:
    """The default list before the user types: good small instruct models and their licences
    (no request; list_files gives a curated repo's files)."""
    return [HubRepo(m.repo, 0, 0, None, m.license, [], m.description) for m in CURATED_MODELS]


def judge_file(hub_file: HubFile, config: EngineConfig | None = None) -> FitVerdict:
    """The fit verdict for `hub_file`, from its GGUF header read with HTTP Range requests only.
    A file the engine cannot run gets a verdict saying why; HubSearchError when the header
    cannot be read (gated, gone, offline, a timeout)."""
    names = hub_file.parts or [hub_file.file]
    # A single file's size is known from the tree; a split file's parts learn theirs.
    sizes = [hub_file.size_bytes] if len(names) == 1 else [None] * len(names)
    parts = [RemoteFile(hub_file.repo, n, size) for n, size in zip(names, sizes, strict=True)]
    try:
        model = read_remote_gguf(parts, hub_file.file)
    except ValueError as e:  # not GGUF, an architecture the engine lacks, a bad header
        return refused_verdict(str(e), config)
    return fit_verdict(model, config)


def judge_files(
    files: Sequence[HubFile], config: EngineConfig | None = None, workers: int = WORKERS
) -> list[FitVerdict | HubSearchError]:
    """judge_file for each of `files`, `workers` at a time; a file whose header could not be
    read gets its HubSearchError in its place."""

    def judge(hub_file: HubFile) -> FitVerdict | HubSearchError:
        try:
            return judge_file(hub_file, config)
        except HubSearchError as e:
            return e

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(judge, files))


def _hub_repo(info: ModelInfo, files: list[HubFile]) -> HubRepo:
    return HubRepo(
        info.id,
        info.downloads or 0,
        info.likes or 0,
        _iso(info.last_modified),
        _license(info),
        files,
    )


def _license(info: ModelInfo) -> str | None:
    """The card's licence, else the hub's `license:` tag."""
    card = info.card_data.get("license") if info.card_data is not None else None
    if isinstance(card, str) and card:
        return card
    tags = [t.removeprefix("license:") for t in info.tags or [] if t.startswith("license:")]
    return tags[0] if tags else None


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
