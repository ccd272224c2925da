"""Where a pull's files live in the standard Hugging Face cache, and how a verified blob enters it.

The layout is huggingface_hub's, so it, transformers and llama.cpp find what we pulled:
`HF_HUB_CACHE/models--org--name/` holds `blobs/<etag>` (the LFS sha256, or the git blob sha1 of a
file kept in git), `snapshots/<commit>/<file>` (a relative symlink to the blob, or the file itself
where symlinks are not supported, as huggingface_hub does) and `refs/main` (the commit).

Bytes in flight are `blobs/<etag>.kvscope.incomplete`, with their state in
`<etag>.kvscope.incomplete.json` beside them: never under snapshots/ and never named `.gguf`, so
nothing that looks for models sees an unverified byte, while huggingface_hub's cache tools
(`scan_cache_dir`, `hf cache`) list them as the incomplete downloads they are. (huggingface_hub
names its own temporary files `<etag>.<random>.incomplete`: it never touches ours.) A blob enters
blobs/ only once its hash matched.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from huggingface_hub import constants
from huggingface_hub.file_download import _create_symlink, repo_folder_name

from kvscope.app.core.hub.search_files import TreeFile, model_files

PARTIAL_SUFFIX = ".kvscope.incomplete"
STATE_SUFFIX = PARTIAL_SUFFIX + ".json"


def hub_cache_dir() -> Path:
    """HF_HUB_CACHE as huggingface_hub resolved it (HF_HOME/hub by default)."""
    return Path(constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class PartialState:
    """What the bytes of a partial file are: written beside it, read back to resume."""

    repo: str
    file: str
    commit: str
    etag: str
    algorithm: str  # "sha256" (LFS) or "git-sha1" (a file kept in git)
    size: int


@dataclass(frozen=True)
class RepoCache:
    """The cache folder of one model repo."""

    repo: str
    root: Path

    @classmethod
    def of(cls, repo: str, cache_dir: Path | None = None) -> RepoCache:
        folder = repo_folder_name(repo_id=repo, repo_type="model")
        return cls(repo, (cache_dir or hub_cache_dir()) / folder)

    def blob(self, etag: str) -> Path:
        return self.root / "blobs" / etag

    def partial(self, etag: str) -> Path:
        return self.root / "blobs" / (etag + PARTIAL_SUFFIX)

    def pointer(self, commit: str, file: str) -> Path:
        return self.root.joinpath("snapshots", commit, *file.split("/"))

    def lock(self, etag: str) -> Path:
        # Beside huggingface_hub's own locks, under a name of ours: its lock guards its temp file,
        # ours guards our partial file (two pulls of one file must not append to one partial).
        return self.root.parent / ".locks" / self.root.name / f"{etag}.kvscope.lock"

    def prepare(self, commit: str) -> None:
        """The folders a download needs, as huggingface_hub makes them before its own: its
        cache scan counts a repo folder without snapshots/ as corrupt."""
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "snapshots" / commit).mkdir(parents=True, exist_ok=True)

    def read_state(self, etag: str) -> PartialState | None:
        try:
            return PartialState(**json.loads(_state_path(self.partial(etag)).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write_state(self, state: PartialState) -> None:
        _write_atomically(_state_path(self.partial(state.etag)), json.dumps(asdict(state)))

    def drop_partial(self, etag: str) -> None:
        """Delete a partial file and its state (bad or abandoned bytes)."""
        self.partial(etag).unlink(missing_ok=True)
        _state_path(self.partial(etag)).unlink(missing_ok=True)

    def publish(self, state: PartialState) -> Path:
        """Move the verified partial to blobs/, point the snapshot at it, set refs/main."""
        blob = self.blob(state.etag)
        os.replace(self.partial(state.etag), blob)
        _state_path(self.partial(state.etag)).unlink(missing_ok=True)
        return self.link(state.etag, state.commit, state.file)

    def link(self, etag: str, commit: str, file: str) -> Path:
        """The snapshot entry for a blob already in blobs/, and refs/main at its commit."""
        pointer = self.pointer(commit, file)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if not pointer.exists():
            _create_symlink(str(self.blob(etag)), str(pointer), new_blob=True)
        ref = self.root / "refs" / "main"
        if not ref.is_file() or ref.read_text() != commit:
            _write_atomically(ref, commit)
        return pointer

    def cached_pointer(self, commit: str, file: str) -> Path | None:
        pointer = self.pointer(commit, file)
        return pointer if pointer.is_file() else None

    def main_commit(self) -> str | None:
        try:
            return (self.root / "refs" / "main").read_text().strip() or None
        except OSError:
            return None

    def snapshot_files(self, commit: str) -> list[str]:
        """Repo paths of the files a snapshot holds (links to missing blobs left out)."""
        snapshot = self.root / "snapshots" / commit
        if not snapshot.is_dir():
            return []
        return sorted(
            p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()
        )


def pending_partials(cache_dir: Path | None = None) -> list[PartialState]:
    """Downloads that stopped part-way (a crash, a cancelled window): what a rerun resumes."""
    root = cache_dir or hub_cache_dir()
    found = []
    for state_file in sorted(root.glob(f"models--*/blobs/*{STATE_SUFFIX}")):
        partial = state_file.with_name(state_file.name.removesuffix(".json"))
        if not partial.is_file():
            continue  # `hf cache` pruned the bytes: nothing to resume
        try:
            found.append(PartialState(**json.loads(state_file.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return found


def cached_ggufs(cache_dir: Path | None = None) -> list[Path]:
    """Every model GGUF in the cache's snapshots, a split model by its first part when all its
    parts are there; links whose blob is missing are left out."""
    root = cache_dir or hub_cache_dir()
    found: dict[Path, Path] = {}
    for snapshot in sorted(root.glob("models--*/snapshots/*")):
        files = [
            TreeFile(p.relative_to(snapshot).as_posix(), 0, None)
            for p in snapshot.rglob("*.gguf")
            if p.is_file()
        ]
        for model in model_files(files):
            first = snapshot / model.path
            # Two snapshots of one repo may share a blob: list the file once.
            found.setdefault(first.resolve(), first)
    return sorted(found.values())


def _state_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    temp.write_text(text)
    os.replace(temp, path)
