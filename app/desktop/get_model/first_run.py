"""FirstRunOffer: under an empty chat, while the bundled model runs, the curated models this
machine can hold, each with its verdict and a Download button.

The bundled SmolLM2-135M is the offline default and stays so; it cannot carry a conversation,
so a user who can run more should hear it first thing. The offer checks, on a thread of its
own, each curated repo's default file (Q4_K_M, else Q8_0, as `kvscope pull` picks) against this
machine from its GGUF header (app/core/hub/search.py's judge_file, HTTP Range requests only).
It shows only when at least one fits, and only beside the empty chat's hint (it follows that
label's visibility); offline, or when nothing fits, nothing shows.
"""

from __future__ import annotations

import html
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.elided_label import ElidedLabel
from kvscope.app.desktop.get_model.look import bold, muted
from kvscope.app.desktop.get_model.texts import size, verdict_cell

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import FitVerdict, HubFile

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # what `kvscope pull REPO` takes when no quant is named
MAX_OFFERED = 4  # rows under the chat's hint; Get a model… lists every curated model


@dataclass(frozen=True)
class Fit:
    """A curated model's default file that fits, with its verdict and what people call it."""

    title: str  # "Qwen2.5 1.5B Instruct": the curated description up to its colon
    hub_file: HubFile
    verdict: FitVerdict


def curated_fits() -> list[Fit]:
    """The curated models' default files that fit this machine, in the curated order (smallest
    first), with their verdicts; a repo that cannot be listed or judged is left out."""
    from concurrent.futures import ThreadPoolExecutor

    from kvscope.app.core.hub.search import (
        HubSearchError,
        curated_models,
        judge_files,
        list_files,
    )

    def default_file(repo: str) -> HubFile | None:
        try:
            files = list_files(repo)
        except HubSearchError:
            return None
        by_quant = {f.quant: f for f in files}
        return next((by_quant[q] for q in DEFAULT_QUANTS if q in by_quant), None)

    curated = curated_models()
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(default_file, [m.repo for m in curated]))
    titles = {m.repo: (m.description or m.repo).split(":")[0] for m in curated}
    files = [f for f in found if f is not None]
    judged = zip(files, judge_files(files), strict=True)
    return [Fit(titles[f.repo], f, v) for f, v in judged if not isinstance(v, Exception) and v.fits]


class _Reports(QObject):
    checked = Signal(object)  # list[Fit]


class FirstRunOffer(QFrame):
    download_requested = Signal(object)  # HubFile
    browse_requested = Signal()  # "Get a model…": the whole window
    resized = Signal()  # shown or reflowed: the chat shows the offer's top (controls.py)

    def __init__(self, empty_hint: QWidget, parent: QWidget | None = None) -> None:
        """`empty_hint`: the chat's "start a conversation" label; the offer shows beside it."""
        super().__init__(parent)
        self.setObjectName("firstRunOffer")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.fits: list[Fit] = []
        self.checking = False
        self._bundled = False
        self._asked = False  # the curated models are checked once a session
        self._dismissed = False
        self._hint = empty_hint
        self.title = bold(QLabel(wordWrap=True))
        self.intro = muted(QLabel(wordWrap=True))
        self._grid = QGridLayout()
        self._grid.setColumnStretch(0, 1)
        browse = QPushButton("Get a model…")
        browse.setToolTip("Search the Hugging Face Hub for more models")
        browse.clicked.connect(self.browse_requested)
        later = QPushButton("Not now")
        later.setToolTip("Keep the bundled model; Engine ▸ Get a model… finds these again")
        later.clicked.connect(self.dismiss)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(browse)
        buttons.addWidget(later)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.intro)
        layout.addLayout(self._grid)
        layout.addLayout(buttons)
        self._reports = _Reports()  # parentless: the check may end after the window closed
        self._reports.checked.connect(self._checked)
        empty_hint.installEventFilter(self)
        self.setVisible(False)

    def set_bundled(self, bundled: bool) -> None:
        """The engine runs the bundled model (True) or the user's own (False). The first time
        it runs the bundled one, the curated models are checked against this machine."""
        self._bundled = bundled
        if bundled and not self._asked and not _offline():
            self._asked = self.checking = True
            reports = self._reports
            threading.Thread(
                target=lambda: reports.checked.emit(_check()), name="kvscope-first-run", daemon=True
            ).start()
        self._show_if_wanted()

    def dismiss(self) -> None:
        """Not now: hidden for the rest of the session."""
        self._dismissed = True
        self._show_if_wanted()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        # The chat shows its hint when a chat is empty and hides it on the first message.
        if watched is self._hint and event.type() in (
            QEvent.Type.ShowToParent,
            QEvent.Type.HideToParent,
        ):
            self._show_if_wanted()
        return False

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if self.isVisible():
            self.resized.emit()

    def _checked(self, fits: list[Fit]) -> None:
        self.checking = False
        self.fits = fits
        self._fill()
        self._show_if_wanted()

    def _fill(self) -> None:
        if not self.fits:
            return
        device = self.fits[0].verdict.device
        where = "RAM" if device == "cpu" else f"{device}'s memory"
        self.title.setText("This computer can run bigger models than the bundled SmolLM2-135M")
        if len(self.fits) <= MAX_OFFERED:
            which = f"These fit this machine's free {where} (read from each file's own header):"
        else:
            which = (
                f"{len(self.fits)} good small models fit this machine's free {where} (read from"
                f" each file's own header); the {MAX_OFFERED} smallest:"
            )
        self.intro.setText(
            "The bundled model is a small offline demo: it cannot hold a real conversation. "
            + which
        )
        # Two lines a model, so the offer fits the chat column at its narrowest: the model
        # and its Download button, then the file and the verdict.
        for n, fit in enumerate(self.fits[:MAX_OFFERED]):
            hub_file, verdict = fit.hub_file, fit.verdict
            name = ElidedLabel(fit.title)
            name.setToolTip(f"{hub_file.repo}\n{hub_file.file}")
            line = f"{hub_file.quant} · {size(hub_file.size_bytes)} · {verdict_cell(verdict)}"
            detail = muted(QLabel(line, wordWrap=True))
            detail.setToolTip(f"<p>{html.escape(verdict.note)}</p>")
            download = QPushButton("Download")
            download.setObjectName("firstRunDownload")
            download.setToolTip(f"Download {hub_file.file} from {hub_file.repo}")
            download.clicked.connect(lambda _c=False, f=hub_file: self.download_requested.emit(f))
            self._grid.addWidget(name, 2 * n, 0)
            self._grid.addWidget(download, 2 * n, 1, 2, 1)
            self._grid.addWidget(detail, 2 * n + 1, 0)

    def _show_if_wanted(self) -> None:
        wanted = self._bundled and not self._dismissed and bool(self.fits)
        holder = self._hint.parentWidget()
        hint_shown = holder is None or self._hint.isVisibleTo(holder)  # shown with the chat
        self.setVisible(wanted and hint_shown)


def _offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it: read here, so an offline start does not pay
    for importing the hub code (~0.5 s of a core) only to be refused."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _check() -> list[Fit]:
    """curated_fits, or none when the hub cannot be asked at all (offline: the bundled model
    is the default, nothing to offer)."""
    # Imported here: an offline start (checked before) never pays for the hub code.
    from kvscope.app.core.hub.search_errors import hub_reachable

    try:
        # One request without retries first: huggingface_hub would retry each of the twelve
        # curated listings for ~27 s, logging every try, to offer nothing.
        return curated_fits() if hub_reachable() else []
    except Exception:  # the offer is a convenience: a failure offers nothing
        return []
