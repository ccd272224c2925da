"""`kvscope pull REPO[:QUANT]`: one model from the Hugging Face Hub into the standard HF cache,
resumable across crashes and verified against the hub's sha256.

A Pull lists the repo (huggingface_hub's `model_info` with file metadata: sizes, LFS sha256 and
the commit), picks the GGUF the quant names (all parts of a split model), checks the free space,
then fetches each part with HTTP Range into a partial file beside the cache's blobs, hashing as the
bytes arrive; a verified part becomes `blobs/<sha256>` with its `snapshots/<commit>/<file>` link.
A rerun (or the app's next start) re-hashes the partial file and asks only for the missing bytes.
"""

from __future__ import annotations

import errno
import importlib.metadata
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx2
from filelock import FileLock, Timeout
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers

from kvscope.app.core.hub.blob_sink import BlobSink
from kvscope.app.core.hub.cache_layout import (
    PartialState,
    RepoCache,
    cached_ggufs,
    pending_partials,
)
from kvscope.app.core.hub.errors import PullCancelled, PullError
from kvscope.app.core.hub.http_range import RetryPolicy, fetch_rest
from kvscope.app.core.hub.hub_errors import describe_hub_error
from kvscope.app.core.hub.pull_control import PullControl
from kvscope.app.core.hub.quant_choice import choose_model
from kvscope.app.core.hub.search_files import ModelFiles, TreeFile, model_files

__all__ = [
    "Pull",
    "PullCancelled",
    "PullError",
    "PullProgress",
    "RemoteFile",
    "cached_ggufs",
    "parse_repo_spec",
    "pending_partials",
    "pick_file",
]

_PROGRESS_EVERY_S = 0.1
_SPEED_WINDOW_S = 5.0
_FREE_SPACE_MARGIN = 16 << 20  # the state file, the snapshot link, the file system's own needs


@dataclass
class PullProgress:
    """Where a pull stands. Bytes count over all parts of a split model; `file` is the part in
    hand. `state`: starting, downloading, verifying (re-hashing what a resume has), paused,
    done, failed, cancelled."""

    repo: str
    file: str
    done_bytes: int
    total_bytes: int
    bytes_per_s: float
    eta_s: float | None
    state: str
    note: str = ""  # why it waits ("no bytes for 30 s; retrying in 2 s") or failed


@dataclass(frozen=True)
class RemoteFile:
    """One file as the hub lists it: what to fetch and how to verify it."""

    path: str
    size: int
    etag: str  # the LFS sha256, or the git blob sha1 of a file kept in git
    algorithm: str  # "sha256" or "git-sha1"


@dataclass(frozen=True)
class _Listing:
    repo: str
    commit: str
    files: dict[str, RemoteFile]


def parse_repo_spec(spec: str) -> tuple[str, str | None]:
    """`org/name:Q4_K_M` -> ("org/name", "Q4_K_M"); `org/name` -> ("org/name", None)."""
    repo, _, quant = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise PullError(f"{spec!r} is not a model repo: write it as ORG/NAME or ORG/NAME:QUANT.")
    return repo, quant or None


def pick_file(repo: str, quant: str | None, file: str | None) -> list[str]:
    """The GGUF file(s) `repo:quant` or `--file` means: the parts of a split model in order.
    Without a quant, Q4_K_M then Q8_0, as llama.cpp's `-hf` picks."""
    return [part.path for part in _choose(_list_repo(repo), quant, file).parts]


class Pull:
    """One model download. `run` blocks (call it from a worker thread); `pause`, `resume` and
    `cancel` may be called from any other thread. `on_progress` is called from the thread in
    `run`, at most every 0.1 s and at each change of state."""

    def __init__(
        self,
        repo: str,
        quant: str | None = None,
        file: str | None = None,
        on_progress: Callable[[PullProgress], None] | None = None,
        *,
        policy: RetryPolicy | None = None,
    ) -> None:
        if quant is not None and file is not None:
            raise PullError("name a quant or a file, not both.")
        self.repo = repo
        self.quant = quant
        self.file = file
        self._on_progress = on_progress
        self._policy = policy or RetryPolicy()
        self._control = PullControl()
        self._lock = threading.Lock()
        self._progress = PullProgress(repo, file or "", 0, 0, 0.0, None, "starting")
        self._last_report = 0.0
        self._samples: deque[tuple[float, int]] = deque()

    # -- controls (any thread) ------------------------------------------------------------------

    def pause(self) -> None:
        self._control.pause()

    def resume(self) -> None:
        self._control.resume()

    def cancel(self) -> None:
        """Stop and delete the partial bytes of the part in hand (finished parts stay)."""
        self._control.cancel()

    @property
    def progress(self) -> PullProgress:
        with self._lock:
            return replace(self._progress)

    # -- the download (one thread) --------------------------------------------------------------

    def run(self) -> Path:
        """Download (or find in the cache) and return the local path of the model's first part,
        `HF_HUB_CACHE/models--org--name/snapshots/<commit>/<file>`."""
        self._report("starting", force=True)
        try:
            path = self._run()
        except PullCancelled:
            self._report("cancelled", force=True)
            raise
        except PullError as error:
            self._report("failed", note=error.message, force=True)
            raise
        self._report("done", done=self.progress.total_bytes, force=True)
        return path

    def _run(self) -> Path:
        cache = RepoCache.of(self.repo)
        if constants.is_offline_mode():
            return self._from_cache(cache, "HF_HUB_OFFLINE is set")
        try:
            listing = _list_repo(self.repo)
        except _Unreachable as unreachable:
            return self._from_cache(cache, str(unreachable))
        model = _choose(listing, self.quant, self.file)
        parts = [listing.files[p.path] for p in model.parts]
        total = sum(p.size for p in parts)
        with self._lock:
            self._progress = replace(self._progress, file=model.path, total_bytes=total)
        _check_free_space(cache, parts)
        finished = 0
        pointers = []
        for part in parts:
            pointers.append(self._fetch_part(cache, listing.commit, part, finished))
            finished += part.size
        return pointers[0]

    def _fetch_part(self, cache: RepoCache, commit: str, part: RemoteFile, before: int) -> Path:
        with self._lock:
            self._progress = replace(self._progress, file=part.path)
        if cache.blob(part.etag).is_file() or cache.cached_pointer(commit, part.path):
            return cache.link(part.etag, commit, part.path)
        lock = FileLock(cache.lock(part.etag), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise PullError(
                f"{part.path} is being downloaded by another pull right now; wait for it."
            ) from None
        try:
            if cache.blob(part.etag).is_file():  # the pull that held the lock finished it
                return cache.link(part.etag, commit, part.path)
            return self._download(cache, commit, part, before)
        finally:
            lock.release()

    def _download(self, cache: RepoCache, commit: str, part: RemoteFile, before: int) -> Path:
        """Resume or start the part's partial file, fill it, verify it, publish it."""
        state = PartialState(self.repo, part.path, commit, part.etag, part.algorithm, part.size)
        cache.prepare(commit)
        if cache.read_state(part.etag) not in (None, state):
            cache.drop_partial(part.etag)  # bytes of some other download under this name
        sink = BlobSink(cache.partial(part.etag), part.algorithm, part.size)
        digest: str | None = None
        try:
            digest = self._fill(sink, cache, state, before)
        except PullCancelled:
            sink.close()
            cache.drop_partial(part.etag)
            raise
        except HfHubHTTPError as error:  # before OSError: huggingface_hub's HTTP errors are both
            raise _http_error(error, self.repo, part.path) from error
        except OSError as error:
            sink.close()
            raise _disk_error(error, cache, part) from error
        finally:
            sink.close()
            partial = cache.partial(part.etag)
            if digest is None and partial.is_file() and partial.stat().st_size == 0:
                cache.drop_partial(part.etag)  # refused before the first byte: nothing to resume
        if digest != part.etag:
            cache.drop_partial(part.etag)
            raise PullError(
                f"checksum mismatch for {part.path}: the hub lists {part.algorithm} {part.etag},"
                f" the downloaded bytes hash to {digest}. The bad bytes were deleted; run the"
                " pull again to download the file afresh."
            )
        return cache.publish(state)

    def _fill(self, sink: BlobSink, cache: RepoCache, state: PartialState, before: int) -> str:
        """Re-hash what the partial file has, fetch the rest; returns the whole file's digest."""
        self._report("verifying", done=before, force=True)
        have = sink.open(lambda n: self._report("verifying", done=before + n))
        cache.write_state(state)
        self._report("downloading", done=before + have, force=True)
        fetch_rest(
            hf_hub_url(self.repo, state.file, revision=state.commit),
            build_hf_headers(library_name="kvscope", library_version=_our_version()),
            sink,
            have,
            state.size,
            self._control,
            lambda n: self._report("downloading", done=before + n, note=""),
            lambda why: self._report(
                "paused" if why == "paused" else "downloading", note=why, force=True
            ),
            self._policy,
        )
        self._report("verifying", done=before + state.size, force=True)
        return sink.hexdigest()

    def _from_cache(self, cache: RepoCache, why: str) -> Path:
        """Offline: the model the quant names, if a finished pull left it in the cache."""
        commit = cache.main_commit()
        files = [TreeFile(p, 0, None) for p in cache.snapshot_files(commit)] if commit else []
        try:
            model = choose_model(self.repo, model_files(files), self.quant, self.file)
        except PullError:
            raise PullError(
                f"cannot reach the Hugging Face Hub ({why}) and {self.repo}"
                f"{':' + self.quant if self.quant else ''} is not in the cache"
                f" ({cache.root.parent})."
            ) from None
        pointer = cache.pointer(commit or "", model.path)
        size = sum(cache.pointer(commit or "", p.path).stat().st_size for p in model.parts)
        with self._lock:
            self._progress = replace(self._progress, file=model.path, total_bytes=size)
        self._report("done", done=size, note=f"from the cache: {why}", force=True)
        return pointer

    # -- progress -------------------------------------------------------------------------------

    def _report(
        self, state: str, *, done: int | None = None, note: str | None = None, force: bool = False
    ) -> None:
        now = time.monotonic()
        with self._lock:
            progress = self._progress
            if done is not None:
                progress = replace(progress, done_bytes=done)
            if state != progress.state or (note is not None and note != progress.note):
                force = True
                progress = replace(progress, note=note or "")
            if state != "downloading":
                self._samples.clear()  # a pause or a re-hash is not download speed
            elif done is not None:
                self._samples.append((now, done))
                while now - self._samples[0][0] > _SPEED_WINDOW_S:
                    self._samples.popleft()
            speed = _speed(self._samples)
            remaining = progress.total_bytes - progress.done_bytes
            eta = remaining / speed if speed > 0 else None
            self._progress = replace(progress, state=state, bytes_per_s=speed, eta_s=eta)
            if not force and now - self._last_report < _PROGRESS_EVERY_S:
                return
            self._last_report = now
            snapshot = replace(self._progress)
        if self._on_progress is not None:
            self._on_progress(snapshot)


class _Unreachable(Exception):
    """The hub cannot be reached at all (no network, a dead proxy, offline mode)."""


def _list_repo(repo: str) -> _Listing:
    """The repo's files with sizes and hashes, at one commit (all parts from the same one)."""
    try:
        info = HfApi().model_info(repo, files_metadata=True)
    except (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled) as error:
        raise _Unreachable(f"{constants.ENDPOINT}: {error}") from error
    except HfHubHTTPError as error:
        raise _http_error(error, repo, None) from error
    if info.sha is None:
        raise PullError(f"the hub gave no commit for {repo}.")
    files = {}
    for sibling in info.siblings or []:
        if sibling.lfs is not None:
            files[sibling.rfilename] = RemoteFile(
                sibling.rfilename, sibling.lfs.size, sibling.lfs.sha256, "sha256"
            )
        elif sibling.size is not None and sibling.blob_id is not None:
            files[sibling.rfilename] = RemoteFile(
                sibling.rfilename, sibling.size, sibling.blob_id, "git-sha1"
            )
    return _Listing(repo, info.sha, files)


def _choose(listing: _Listing, quant: str | None, file: str | None) -> ModelFiles:
    tree = [TreeFile(f.path, f.size, None) for f in listing.files.values()]
    return choose_model(listing.repo, model_files(tree), quant, file)


def _check_free_space(cache: RepoCache, parts: list[RemoteFile]) -> None:
    """Refuse to start what cannot finish: the bytes still missing must fit on the disk."""
    needed = 0
    for part in parts:
        if cache.blob(part.etag).is_file():
            continue
        partial = cache.partial(part.etag)
        have = partial.stat().st_size if partial.is_file() else 0
        needed += max(part.size - have, 0)
    if needed == 0:
        return
    folder = cache.root / "blobs"
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < needed + _FREE_SPACE_MARGIN:
        raise PullError(
            f"not enough free disk space: the download needs {_gib(needed)} more, {folder} has"
            f" {_gib(free)} free. Free some space (or set HF_HUB_CACHE to a bigger disk) and"
            " run the pull again."
        )


def _disk_error(error: OSError, cache: RepoCache, part: RemoteFile) -> PullError:
    partial = cache.partial(part.etag)
    have = partial.stat().st_size if partial.is_file() else 0
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return PullError(
            f"the disk is full ({cache.root.parent}): {have:,} of {part.size:,} bytes of"
            f" {part.path} are kept. Free some space and run the pull again to resume."
        )
    return PullError(f"cannot write {partial}: {error.strerror or error}.")


def _http_error(error: HfHubHTTPError, repo: str, file: str | None) -> PullError:
    return PullError(describe_hub_error(error, repo, file))


def _our_version() -> str:
    """For the user agent the hub sees (huggingface_hub adds its own and Python's)."""
    try:
        return importlib.metadata.version("kvscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _speed(samples: deque[tuple[float, int]]) -> float:
    if len(samples) < 2:
        return 0.0
    (t0, b0), (t1, b1) = samples[0], samples[-1]
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
