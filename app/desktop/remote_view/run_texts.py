"""RunTexts: the text of remote blocks, asked of the servers that hold them.

The tree's rows and the selected branch show token ids until someone decodes them. Without a
local detokenizer (the app's own model is rarely the server's), a server holding the run is
asked (POST /detokenize, app/desktop/remote_view/remote_text.py) in a worker thread: for the
selected run its whole text, for the rows a one-line preview, PREVIEW_BATCH rows a job, the next job
once one answers. Answers come back to the GUI thread as queued signals; a server that cannot
decode a run (no /detokenize, another model) is not asked for it again."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QTextBrowser

from kvscope.app.desktop.remote_view.merged_tree import TreeRun
from kvscope.app.desktop.remote_view.prefix_tree import PrefixTreeView
from kvscope.app.desktop.remote_view.remote_text import detokenize_over_http

DETAIL_CHARS = 20_000
DECODED_CACHE = 256  # runs whose server text is kept
PREVIEW_BATCH = 32  # tree rows whose preview one worker job decodes


def _decode_all(wanted) -> tuple[dict, set]:
    """In the worker: each row's preview tokens decoded by a server holding them; a server
    that fails is not asked again in this job."""
    texts, failed, down = {}, set(), set()
    for tokens, holder in wanted:
        label = holder.connection.label
        if label in down:
            continue
        try:
            texts[tokens] = detokenize_over_http(holder.connection, holder.model, tokens)
        except (httpx.HTTPStatusError, ValueError):
            failed.add(tokens)  # this server cannot decode these (no /detokenize, other model)
        except httpx.HTTPError:
            down.add(label)
    return texts, failed


def _same_run(a: TreeRun | None, b: TreeRun | None) -> bool:
    return (
        a is not None
        and b is not None
        and (a.key, a.blocks, a.replicas, a.subtree_blocks)
        == (b.key, b.blocks, b.replicas, b.subtree_blocks)
    )


class RunTexts(QObject):
    decoded = Signal(object)  # (token ids, the server's text of them), from the worker
    previews = Signal(object)  # ({preview tokens: text}, {preview tokens that failed})

    def __init__(
        self,
        tree: PrefixTreeView,
        detail: QTextBrowser,
        snapshots: Callable[[], list],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.tree = tree
        self.detail = detail
        self._snapshots = snapshots  # the view's latest ReplicaSnapshots
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-detok")
        self._closed = False
        self._decoded: dict[tuple[int, ...], str] = {}
        self._selected: TreeRun | None = None
        self._previews_busy = False
        self._preview_failed: set[tuple[int, ...]] = set()  # not asked again
        self.decoded.connect(self._on_decoded)
        self.previews.connect(self._on_previews)

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _holder(self, run: TreeRun):
        """A snapshot of a replica that holds `run` and answers HTTP, or None."""
        return next(
            (
                s
                for s in self._snapshots()
                if s.connection.label in run.replicas and s.http_state == "up"
            ),
            None,
        )

    # ---- the selected run ----------------------------------------------------------------
    def show_run(self, run: TreeRun | None) -> None:
        """The selected run in the detail box; without a local detokenizer its text is asked
        of a replica holding it, token ids shown meanwhile."""
        same = _same_run(run, self._selected)
        self._selected = run
        if same:
            return  # the tree was redrawn around it: keep the detail's scroll position
        if run is None:
            self.detail.setHtml("")
            return
        text = self._decoded.get(run.token_ids)
        self.detail.setHtml(self.tree.describe(run, max_chars=DETAIL_CHARS, text=text))
        if text is not None or self.tree.detokenize is not None or not run.token_ids:
            return
        holder = self._holder(run)
        if holder is None or self._closed:
            return
        future = self._pool.submit(
            detokenize_over_http, holder.connection, holder.model, run.token_ids
        )
        future.add_done_callback(lambda f: self._decoded_ready(run.token_ids, f))

    def _decoded_ready(self, tokens: tuple[int, ...], future) -> None:
        """On the worker thread: the server's text for a run, to the GUI thread."""
        if future.cancelled() or future.exception() is not None:
            return  # the detail keeps showing token ids
        try:
            self.decoded.emit((tokens, future.result()))
        except RuntimeError:  # deleted meanwhile
            pass

    def _on_decoded(self, answer: tuple) -> None:
        tokens, text = answer
        if len(self._decoded) >= DECODED_CACHE:
            self._decoded.clear()
        self._decoded[tokens] = text
        run = self._selected
        if run is not None and run.token_ids == tokens:
            self.detail.setHtml(self.tree.describe(run, max_chars=DETAIL_CHARS, text=text))

    # ---- the rows' previews --------------------------------------------------------------
    def decode_previews(self) -> None:
        """Ask for the text of rows still showing token ids (after every redraw)."""
        if self.tree.detokenize is not None or self._closed or self._previews_busy:
            return
        wanted = []
        for run in self.tree.visible_runs():
            tokens = self.tree.preview_tokens(run)
            if not tokens or tokens in self.tree.previews or tokens in self._preview_failed:
                continue
            holder = self._holder(run)
            if holder is not None:
                wanted.append((tokens, holder))
            if len(wanted) >= PREVIEW_BATCH:
                break
        if not wanted:
            return
        self._previews_busy = True
        self._pool.submit(_decode_all, wanted).add_done_callback(self._previews_ready)

    def _previews_ready(self, future) -> None:
        """On the worker thread: hand the texts to the GUI thread."""
        failed = future.cancelled() or future.exception() is not None
        try:
            self.previews.emit(({}, set()) if failed else future.result())
        except RuntimeError:
            pass

    def _on_previews(self, answer: tuple) -> None:
        texts, failed = answer
        self._previews_busy = False
        self._preview_failed.update(failed)
        if len(self.tree.previews) > DECODED_CACHE * 4:
            self.tree.previews.clear()
        self.tree.show_previews(texts)
        if texts:
            self.decode_previews()  # the next batch
