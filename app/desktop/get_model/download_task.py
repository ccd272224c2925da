"""DownloadTask: one model download (app/core/hub/pull.py's Pull) on a thread of its own, its
progress and its end delivered to the GUI thread as Qt signals.

`Pull.run` blocks for the whole download, so it runs on a daemon thread; its `on_progress`
callback (at most every 0.1 s, from that thread) emits a signal, which Qt queues to the GUI
thread where the row that shows it lives. Pause, resume and cancel are the Pull's own controls,
safe to call from the GUI thread while `run` works. A failed download can start again: a new
Pull resumes from the verified bytes the partial file holds.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from kvscope.app.core.hub.http_range import RetryPolicy
    from kvscope.app.core.hub.pull import Pull


class _Reports(QObject):
    """Emitted from the download thread, delivered queued on the GUI thread."""

    progressed = Signal(object)  # PullProgress
    finished = Signal(str)  # the local path of the model (its first part)
    failed = Signal(str)  # why, in words
    cancelled = Signal()


class DownloadTask(QObject):
    def __init__(
        self,
        repo: str,
        file: str,
        parent: QObject | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__(parent)
        self.repo = repo
        self.file = file
        self._policy = policy
        # Parentless, held by the thread too: a late signal still has an object to come from.
        self._reports = _Reports()
        self.progressed = self._reports.progressed
        self.finished = self._reports.finished
        self.failed = self._reports.failed
        self.cancelled = self._reports.cancelled
        self._pull: Pull | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start (or, after a failure, restart) the download; nothing while one runs."""
        from kvscope.app.core.hub.pull import Pull

        if self.running:
            return
        reports = self._reports
        pull = Pull(
            self.repo, file=self.file, on_progress=reports.progressed.emit, policy=self._policy
        )
        self._pull = pull
        self._thread = threading.Thread(
            target=_run, args=(pull, reports), name=f"kvscope-pull {self.file}", daemon=True
        )
        self._thread.start()

    def pause(self) -> None:
        if self._pull is not None:
            self._pull.pause()

    def resume(self) -> None:
        if self._pull is not None:
            self._pull.resume()

    def cancel(self) -> None:
        """Stop and delete the partial bytes (the Pull's cancel)."""
        if self._pull is not None:
            self._pull.cancel()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the download thread ends (tests, the app's exit); False on timeout."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.running


def _run(pull: Pull, reports: _Reports) -> None:
    """The download thread: run the pull, then say how it ended."""
    from kvscope.app.core.hub.pull import PullCancelled, PullError

    try:
        path = pull.run()
    except PullCancelled:
        reports.cancelled.emit()
    except PullError as e:
        reports.failed.emit(e.message)
    except Exception as e:  # anything the pull did not foresee: the row says it, the app lives
        reports.failed.emit(f"{type(e).__name__}: {e}")
    else:
        reports.finished.emit(str(path))
