"""HubJobs: the window's hub requests (search, a repo's files, a file's fit verdict) on a small
thread pool, answered on the GUI thread through Qt signals.

A verdict reads a GGUF header with HTTP Range requests, a search lists repos and their trees:
each takes from tens of milliseconds to seconds, so none may run on the GUI thread. Every
answer is a result or the error's message in words. Each file is judged once per window (the
verdicts are kept by the caller); a newer search makes an older one's answer stale, which its
ticket tells.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import HubFile

WORKERS = 4  # header reads at once: what search.judge_files uses, polite to the hub

FileKey = tuple[str, str]  # (repo, file): one GGUF model of one repo


def file_key(hub_file: HubFile) -> FileKey:
    return hub_file.repo, hub_file.file


class _Reports(QObject):
    """The pool threads' answers; queued to the GUI thread, where this object lives."""

    searched = Signal(int, object)  # ticket, list[HubRepo] | str (the error in words)
    listed = Signal(str, object)  # repo, list[HubFile] | str
    judged = Signal(object, object)  # FileKey, FitVerdict | str


class HubJobs(QObject):
    def __init__(self, parent: QObject | None = None, workers: int = WORKERS) -> None:
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvscope-hub")
        # Parentless and held by each job: an answer arriving after the window closed has a
        # live object to be emitted from.
        self.reports = _Reports()
        self.searched = self.reports.searched
        self.listed = self.reports.listed
        self.judged = self.reports.judged
        self._ticket = 0
        self._asked: set[FileKey] = set()
        self._closed = False

    def search(self, query: str) -> int:
        """Ask for GGUF repos matching `query`; answered by `searched` with the ticket returned
        (only the newest ticket's answer is current)."""
        from kvscope.app.core.hub.search import search_models

        self._ticket += 1
        ticket, reports = self._ticket, self.reports
        self._submit(lambda: reports.searched.emit(ticket, _answer(lambda: search_models(query))))
        return ticket

    @property
    def ticket(self) -> int:
        """The newest search's ticket."""
        return self._ticket

    def list_files(self, repo: str) -> None:
        """Ask for `repo`'s GGUF models; answered by `listed`."""
        from kvscope.app.core.hub.search import list_files

        reports = self.reports
        self._submit(lambda: reports.listed.emit(repo, _answer(lambda: list_files(repo))))

    def judge(self, hub_file: HubFile) -> bool:
        """Ask for `hub_file`'s verdict on this machine (answered by `judged`); False when it
        was asked for already."""
        from kvscope.app.core.hub.search import judge_file

        key = file_key(hub_file)
        if key in self._asked:
            return False
        self._asked.add(key)
        reports = self.reports
        self._submit(lambda: reports.judged.emit(key, _answer(lambda: judge_file(hub_file))))
        return True

    def shutdown(self) -> None:
        """Drop the queued requests; those running finish on their own (daemon-like)."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, job: Callable[[], None]) -> None:
        if not self._closed:
            self._pool.submit(job)


def _answer(request: Callable[[], object]) -> object:
    """The request's result, or why it failed in words (HubSearchError says it already)."""
    from kvscope.app.core.hub.search import HubSearchError

    try:
        return request()
    except HubSearchError as e:
        return e.message
    except Exception as e:  # a hub answer no one foresaw: a line in the window, not a crash
        return f"{type(e).__name__}: {e}"
