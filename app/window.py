"""MainWindow: conversations, the chat, and the KV block map over one engine worker.

The window owns the chat store (GUI thread only) and an EngineClient; the engine itself lives in
the worker thread (app/worker.py). A user message is committed when sent; a reply is committed
when it finishes or is stopped (partial text, marked stopped), so a crash loses at most the
reply in flight. Request ids are "conv-{conversation id}/r{n}": the block map colours by the
part before the slash.
"""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.blockmap import BlockMapPanel
from app.chat.chat_view import ChatView
from app.chat.conversation_list import ConversationList
from app.chat.recovery import open_chat_store
from app.chat.store import default_store_path
from app.loadgen_panel import LoadGeneratorPanel
from app.model_picker import format_count
from app.paths import ASSETS_DIR
from app.settings import (
    AppSettings,
    SettingsDialog,
    load_settings,
    save_settings,
    settings_path,
)
from app.worker import EngineClient, EngineInfo, ReplyUpdate, Telemetry

NEW_CHAT_TITLE = "New chat"
MAP_MIN_WIDTH = 560
STREAM_REDRAW_MS = 80


def conversation_group(conversation_id: int) -> str:
    return f"conv-{conversation_id}"


def group_of(request_id: str) -> str:
    return request_id.split("/", 1)[0]


@dataclass
class PendingReply:
    """A reply in flight: lives in memory only until it finishes or is stopped."""

    request_id: str
    conversation_id: int
    texts: list[str] = field(default_factory=list)
    selected: int = 0
    update: ReplyUpdate | None = None


class MainWindow(QMainWindow):
    engine_ready = Signal(object)  # EngineInfo, after the first load and every rebuild
    engine_failed = Signal(str)
    reply_updated = Signal(object)  # ReplyUpdate of a reply in flight, on the GUI thread
    reply_finished = Signal(int, str)  # conversation id, status ("complete" | "stopped")
    reply_failed = Signal(int, str)  # conversation id, message
    telemetry_received = Signal(object)  # Telemetry
    error_shown = Signal(str)  # every error the window reports in a dialog

    def __init__(
        self,
        settings: AppSettings | None = None,
        loaded_model=None,
        store_path=None,
        persist_settings: bool = True,
    ) -> None:
        super().__init__()
        self.setWindowTitle("KVScope")
        self.resize(1400, 860)
        self._persist_settings = persist_settings
        self.last_error: str | None = None
        self._error_box: QMessageBox | None = None
        settings_problem = None
        if settings is None:
            try:
                settings = load_settings()
            except ValueError as e:
                settings, settings_problem = AppSettings(), str(e)
        self.settings = settings
        self.store, store_problem = open_chat_store(store_path or default_store_path())
        self.engine_info: EngineInfo | None = None
        self.last_telemetry: Telemetry | None = None
        self.current_id: int | None = None
        self._map_paused = False
        self._telemetry_due = False
        self._stream_timer = QTimer(self, singleShot=True, interval=STREAM_REDRAW_MS)
        self._stream_timer.timeout.connect(self._show_stream)
        self.pending: dict[int, PendingReply] = {}
        self._by_request: dict[str, int] = {}
        self._ids = itertools.count(1)

        self.conversations = ConversationList(self.store)
        self.chat = ChatView()
        self.chat.sampling.set_settings(settings.sampling)
        self.blockmap = BlockMapPanel()
        # Its metrics strip asks for ever more width as numbers grow; the window keeps its size
        # and the panel gets what the splitter gives it.
        self.blockmap.setMinimumWidth(MAP_MIN_WIDTH)
        self.loadgen_panel = LoadGeneratorPanel()
        self.loadgen_panel.setVisible(False)
        self.loadgen_toggle = QToolButton(
            text="Simulated users (load generator)", checkable=True, objectName="sectionToggle"
        )
        self.loadgen_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.loadgen_toggle.setArrowType(Qt.RightArrow)
        self.loadgen_toggle.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.loadgen_toggle.toggled.connect(self._toggle_loadgen)
        right = QWidget(objectName="mapColumn")
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(0)
        right_layout.addWidget(self.blockmap, 1)
        right_layout.addWidget(self.loadgen_toggle)
        right_layout.addWidget(self.loadgen_panel)

        splitter = QSplitter(Qt.Horizontal, objectName="mainSplitter")
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.chat)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 2)
        splitter.setStretchFactor(2, 3)
        self.splitter = splitter
        self._sized = False
        self.setCentralWidget(splitter)
        self._build_menu()
        self._build_status_bar()

        self.conversations.new_requested.connect(self.new_conversation)
        self.conversations.conversation_selected.connect(self.open_conversation)
        self.conversations.rename_requested.connect(self.rename_conversation)
        self.conversations.delete_requested.connect(self.delete_conversation)
        self.chat.send_requested.connect(self._send_requested)
        self.chat.stop_requested.connect(self.stop_current)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.alternative_selected.connect(self._select_alternative)
        self.chat.system_prompt_changed.connect(self._system_prompt_changed)
        self.chat.sampling.changed.connect(self._sampling_changed)

        self.client = EngineClient(settings.engine, loaded_model)
        # Bound methods of this window only: a lambda would run in the worker's thread.
        self.client.engine_ready.connect(self._on_engine_ready)
        self.client.engine_failed.connect(self._on_engine_failed)
        self.client.busy.connect(self._on_busy)
        self.client.request_output.connect(self._on_output)
        self.client.request_failed.connect(self._on_request_failed)
        self.client.telemetry.connect(self._on_telemetry)
        self.client.error.connect(self._on_engine_error)
        self.client.load_status.connect(self._on_load_status)
        self._connect_blockmap()
        self.loadgen_panel.start_requested.connect(self.client.start_load)
        self.loadgen_panel.stop_requested.connect(self.client.stop_load)
        self.client.start()

        self.conversations.refresh()
        existing = self.store.conversations()
        self.open_conversation(existing[0].id if existing else None)
        self._refresh_group_labels()
        if settings_problem:
            self.show_error("Settings were reset", settings_problem)
        if store_problem:
            self.show_error("The chats database could not be used as it was", store_problem)
        from app import paths

        if paths.data_dir_problem:
            self.show_error("The data folder cannot be used", paths.data_dir_problem)

    # ---- layout ---------------------------------------------------------------------------
    def _build_menu(self) -> None:
        menu = self.menuBar().addMenu("&Chat")
        new = QAction("New chat", self, shortcut=QKeySequence.New)
        new.triggered.connect(self.new_conversation)
        settings = QAction("Model and engine…", self, shortcut=QKeySequence.Preferences)
        settings.triggered.connect(self.open_settings)
        quit_ = QAction("Quit", self, shortcut=QKeySequence.Quit)
        quit_.triggered.connect(self.close)
        menu.addActions([new, settings])
        menu.addSeparator()
        menu.addAction(quit_)
        engine_menu = self.menuBar().addMenu("&Engine")
        engine_menu.addAction(settings)
        self.pause_map_action = QAction("Pause block map", self, checkable=True)
        self.pause_map_action.setToolTip("Hold the map still to inspect it; the engine runs on")
        self.pause_map_action.toggled.connect(self.set_map_paused)
        engine_menu.addAction(self.pause_map_action)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.state_label = QLabel("Starting…", objectName="engineState")
        self.pool_label = QLabel(objectName="poolLabel")
        # A fixed width: text that changes ten times a second must not relayout the window.
        sample = "KV 000000/000000 blocks used, 000000 cached · 0000 running"
        self.pool_label.setFixedWidth(self.pool_label.fontMetrics().horizontalAdvance(sample) + 16)
        self.model_label = QLabel(objectName="modelLabel")
        self.busy_bar = QProgressBar(objectName="busyBar", maximumWidth=140, textVisible=False)
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setVisible(False)
        bar.addWidget(self.state_label)
        bar.addPermanentWidget(self.pool_label)
        bar.addPermanentWidget(self.model_label)
        bar.addPermanentWidget(self.busy_bar)

    # ---- conversations --------------------------------------------------------------------
    def new_conversation(self) -> int:
        conv = self.store.create_conversation(NEW_CHAT_TITLE)
        self.conversations.search.clear()
        self.conversations.refresh()
        self.open_conversation(conv.id)
        self._refresh_group_labels()
        self.chat.composer.setFocus()
        return conv.id

    def open_conversation(self, conversation_id: int | None) -> None:
        self.current_id = conversation_id
        self.conversations.select(conversation_id)
        self._render_current()

    def _render_current(self) -> None:
        cid = self.current_id
        conv = self.store.conversation(cid) if cid is not None else None
        self.chat.set_conversation(conv, self.store.messages(cid) if conv else [])
        pending = self.pending.get(cid) if cid is not None else None
        self.chat.set_generating(pending is not None)
        if pending is not None:
            self.chat.start_pending()
            if pending.texts:
                metrics = pending.update.metrics() if pending.update else None
                self.chat.update_pending(pending.texts, pending.selected, metrics)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename(conversation_id, title)
        self.conversations.refresh()
        if conversation_id == self.current_id:
            self.chat.title.setText(title)
        self._refresh_group_labels()

    def delete_conversation(self, conversation_id: int) -> None:
        pending = self.pending.pop(conversation_id, None)
        if pending is not None:
            self._by_request.pop(pending.request_id, None)
            self.client.stop(pending.request_id)
        self.store.delete_conversation(conversation_id)
        self.conversations.refresh()
        if conversation_id == self.current_id:
            remaining = self.store.conversations()
            self.open_conversation(remaining[0].id if remaining else None)
        self._refresh_group_labels()

    def _system_prompt_changed(self, conversation_id: int, text: str) -> None:
        if any(c.id == conversation_id for c in self.store.conversations()):  # not deleted
            self.store.set_system_prompt(conversation_id, text)

    def _refresh_group_labels(self) -> None:
        labels = {conversation_group(c.id): c.title for c in self.store.conversations()}
        self.blockmap.set_group_labels(labels)

    # ---- chatting -------------------------------------------------------------------------
    def send_message(self, text: str, conversation_id: int | None = None) -> int:
        """Commit a user message and start its reply; returns the conversation id."""
        cid = conversation_id if conversation_id is not None else self.current_id
        if cid is None:
            cid = self.new_conversation()
        if cid in self.pending:
            raise ValueError(f"conversation {cid} is still generating; stop it first")
        first = not self.store.messages(cid)
        self.store.add_message(cid, "user", text)
        if first and self.store.conversation(cid).title == NEW_CHAT_TITLE:
            self.store.rename(cid, _title_from(text))
            self.conversations.refresh()
            self._refresh_group_labels()
        self._start_reply(cid)
        return cid

    def _send_requested(self, text: str, editing: int) -> None:
        try:
            if editing >= 0:
                self.edit_and_resend(editing, text)
            else:
                self.send_message(text)
        except (sqlite3.Error, OSError) as e:  # a full or read-only disk: nothing is lost
            self.show_error(
                "The message could not be saved",
                f"{e}\n\nNothing was sent; your text is still in the message box.",
            )
            return
        except ValueError as e:  # e.g. still generating
            self.show_error("The message was not sent", str(e))
            return
        self.chat.message_sent()

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user message's text, drop everything after it, and reply anew."""
        msg = self.store.edit_and_truncate(message_id, text)
        self._start_reply(msg.conversation_id)

    def regenerate(self, conversation_id: int | None = None) -> None:
        """Redo the last reply (or retry a user message whose reply failed)."""
        cid = conversation_id if conversation_id is not None else self.current_id
        if cid is None or cid in self.pending:
            return
        messages = self.store.messages(cid)
        if not messages:
            return
        if messages[-1].role == "assistant":
            self.store.truncate_from(messages[-1].id)
        self._start_reply(cid)

    def stop(self, conversation_id: int) -> None:
        pending = self.pending.get(conversation_id)
        if pending is not None:
            self.client.stop(pending.request_id)

    def stop_current(self) -> None:
        if self.current_id is not None:
            self.stop(self.current_id)

    def request_id_of(self, conversation_id: int) -> str | None:
        pending = self.pending.get(conversation_id)
        return pending.request_id if pending else None

    def _start_reply(self, cid: int) -> None:
        conv = self.store.conversation(cid)
        turns = [{"role": m.role, "content": m.content} for m in self.store.messages(cid)]
        request_id = f"{conversation_group(cid)}/r{next(self._ids)}"
        self.pending[cid] = PendingReply(request_id, cid)
        self._by_request[request_id] = cid
        params = self.chat.sampling.settings().params_kwargs()
        self.client.submit(
            request_id, conv.system_prompt, turns, params, self.settings.overflow_policy
        )
        self.conversations.set_generating(cid, True)
        if cid == self.current_id:
            self._render_current()
        self._update_state()

    def _on_output(self, update: ReplyUpdate) -> None:
        cid = self._by_request.get(update.request_id)
        pending = self.pending.get(cid) if cid is not None else None
        if pending is None or pending.request_id != update.request_id:
            return  # its conversation was deleted meanwhile
        pending.texts, pending.update = update.texts, update
        self.reply_updated.emit(update)
        if update.finished:
            self._finish_reply(pending)
        elif cid == self.current_id and not self._stream_timer.isActive():
            # Redraw the streaming bubble at most every STREAM_REDRAW_MS, with the newest text.
            self._stream_timer.start()

    def _show_stream(self) -> None:
        pending = self.pending.get(self.current_id) if self.current_id is not None else None
        if pending is not None and pending.update is not None:
            self.chat.update_pending(pending.texts, pending.selected, pending.update.metrics())

    def _finish_reply(self, pending: PendingReply) -> None:
        update = pending.update
        stopped = update is None or "abort" in update.finish_reasons
        status = "stopped" if stopped else "complete"
        texts = pending.texts or [""]
        try:
            message = self.store.add_message(
                pending.conversation_id,
                "assistant",
                texts[pending.selected],
                status=status,
                alternatives=texts if len(texts) > 1 else None,
                selected=pending.selected,
                metrics=update.metrics() if update else None,
            )
        except (sqlite3.Error, OSError) as e:
            # Not stored, so not shown as stored: the chat leaves "generating" (Stop and Send
            # work again) and the text is handed to the user in the error.
            self._forget(pending)
            self.show_error(
                "The reply could not be saved",
                f"{e}\n\nThe reply was:\n\n{texts[pending.selected]}",
            )
            self.reply_failed.emit(pending.conversation_id, str(e))
            return
        if pending.conversation_id == self.current_id:
            self.chat.finish_pending(message)
        self._forget(pending, redraw=False)
        self.reply_finished.emit(pending.conversation_id, status)

    def _on_request_failed(self, request_id: str, message: str) -> None:
        cid = self._by_request.get(request_id)
        pending = self.pending.get(cid) if cid is not None else None
        if pending is None or pending.request_id != request_id:
            return
        self._forget(pending)
        if cid == self.current_id:
            self.chat.show_notice(message)
        self.statusBar().showMessage(f"Reply failed: {message}", 10_000)
        self.reply_failed.emit(cid, message)

    def _forget(self, pending: PendingReply, redraw: bool = True) -> None:
        cid = pending.conversation_id
        self.pending.pop(cid, None)
        self._by_request.pop(pending.request_id, None)
        self.conversations.set_generating(cid, False)
        if cid == self.current_id:
            if redraw:
                self._render_current()
            else:
                self.chat.set_generating(False)
        self._update_state()

    def _select_alternative(self, message_id: int, index: int) -> None:
        if message_id < 0:
            pending = self.pending.get(self.current_id)
            if pending is not None:
                pending.selected = index
                metrics = pending.update.metrics() if pending.update else None
                self.chat.update_pending(pending.texts, index, metrics)
            return
        self.store.select_alternative(message_id, index)
        self._render_current()

    def _sampling_changed(self, sampling) -> None:
        self.settings.sampling = sampling
        self._save_settings()

    def _toggle_loadgen(self, shown: bool) -> None:
        self.loadgen_panel.setVisible(shown)
        self.loadgen_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)

    # ---- engine ---------------------------------------------------------------------------
    def open_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(self.settings, self)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings()))
        dialog.open()
        return dialog

    def apply_settings(self, settings: AppSettings) -> None:
        """Adopt new settings; engine knobs rebuild the engine in the worker (chats survive)."""
        settings.sampling = self.chat.sampling.settings()
        rebuild = settings.engine != self.settings.engine
        self.settings = settings
        if rebuild:
            self.client.apply_settings(settings.engine)
        self._save_settings()

    def _save_settings(self) -> None:
        if self._persist_settings:
            try:
                save_settings(self.settings)
            except OSError as e:
                self.statusBar().showMessage(f"Could not save {settings_path()}: {e}", 10_000)

    def _on_engine_ready(self, info: EngineInfo) -> None:
        self.engine_info = info
        # After a failed rebuild the worker restores the old engine: keep settings in step.
        self.settings.engine = info.settings
        self.model_label.setText(
            f"{info.model_name} · {info.architecture} {format_count(info.num_parameters)} · "
            f"{info.device} {info.dtype} · weights {info.weight_format} "
            f"{info.weight_bytes / 2**20:,.0f} MiB · KV {info.kv_dtype} "
            f"{info.kv_bytes_per_token / 1024:.0f} KiB/token · "
            f"{info.num_blocks:,} blocks × {info.block_size}"
        )
        self.model_label.setToolTip(
            f"{info.model_source}\nmax_model_len {info.max_model_len:,}\n"
            f"weights: {info.weight_format}, {info.weight_bytes:,} bytes, "
            f"run as {info.weight_layout}"
        )
        self._update_state()
        self.engine_ready.emit(info)

    def _on_engine_failed(self, message: str) -> None:
        if self.engine_info is not None:
            self.settings.engine = self.engine_info.settings
            self._save_settings()
        self.show_error("The engine could not be built", message)
        self._update_state()
        self.engine_failed.emit(message)

    def _on_engine_error(self, message: str) -> None:
        self.show_error("Engine error", message)

    def _on_busy(self, text: str) -> None:
        self.busy_bar.setVisible(bool(text))
        if text:
            self.state_label.setText(text)
        else:
            self._update_state()

    def _update_state(self) -> None:
        if self.busy_bar.isVisible():
            return
        if self.engine_info is None:
            self.state_label.setText("No model loaded")
        elif self.pending:
            n = len(self.pending)
            self.state_label.setText(f"Generating {n} repl{'y' if n == 1 else 'ies'}")
        else:
            self.state_label.setText("Ready")

    def _on_telemetry(self, telemetry: Telemetry) -> None:
        # Only the newest matters: if the GUI fell behind, queued older ones are skipped.
        self.last_telemetry = telemetry
        if not self._telemetry_due:
            self._telemetry_due = True
            QTimer.singleShot(0, self._show_telemetry)

    def _show_telemetry(self) -> None:
        self._telemetry_due = False
        telemetry = self.last_telemetry
        s = telemetry.stats
        self.pool_label.setText(
            f"KV {s['kv_blocks_used']}/{s['kv_blocks_total']} blocks used, "
            f"{s['kv_blocks_cached']} cached · {s['num_running']} running"
        )
        if not self._map_paused:
            self.blockmap.update_view(
                telemetry.paged, telemetry.shadow, telemetry.stats, telemetry.device_memory
            )
        self.telemetry_received.emit(telemetry)

    # ---- block map ----------------------------------------------------------------------
    def _connect_blockmap(self) -> None:
        """Hovering a block asks the worker for its tokens (block_contents); the answer comes
        back as a signal and goes to the panel, which updates its hover card."""
        self.blockmap.set_block_info_provider(self.client.query_block)
        self.client.block_info.connect(self._on_block_info)
        self.blockmap.sequence_selected.connect(self._sequence_selected)

    def _on_block_info(self, block_id: int, contents: dict) -> None:
        self.blockmap.show_block_info(block_id, contents)

    def _sequence_selected(self, seq_id: int) -> None:
        """Selecting a chat's sequence on the map opens that chat."""
        snapshot = self.last_telemetry.paged if self.last_telemetry else None
        info = snapshot.sequence(seq_id) if snapshot is not None else None
        if info is None:
            return
        group = group_of(info.request_id)
        if group.startswith("conv-"):
            conversation_id = int(group.removeprefix("conv-"))
            if conversation_id != self.current_id:
                self.open_conversation(conversation_id)

    def set_map_paused(self, paused: bool) -> None:
        """Stop (or resume) feeding the block map; the status bar keeps counting."""
        self._map_paused = paused
        self.pause_map_action.setChecked(paused)

    def _on_load_status(self, running: bool, line: str) -> None:
        self.loadgen_panel.set_running(running)
        self.loadgen_panel.set_status(line)

    # ---- errors and closing ---------------------------------------------------------------
    def show_error(self, title: str, message: str) -> None:
        """A non-blocking error dialog plus the status bar; the app keeps running."""
        self.last_error = message
        self.statusBar().showMessage(f"{title}: {message.splitlines()[0]}", 15_000)
        box = QMessageBox(QMessageBox.Warning, title, message, QMessageBox.Ok, self)
        box.setAttribute(Qt.WA_DeleteOnClose)
        box.open()
        self._error_box = box
        self.error_shown.emit(message)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not self._sized:  # before the first show the splitter would redistribute them
            self._sized = True
            rest = self.width() - 210
            self.splitter.setSizes([210, int(rest * 0.37), int(rest * 0.63)])

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        # Replies in flight are kept as far as they got, marked stopped.
        for pending in list(self.pending.values()):
            if pending.update is not None:
                self.store.add_message(
                    pending.conversation_id,
                    "assistant",
                    pending.texts[pending.selected] if pending.texts else "",
                    status="stopped",
                    alternatives=pending.texts if len(pending.texts) > 1 else None,
                    selected=pending.selected,
                    metrics=pending.update.metrics(),
                )
        self.pending.clear()
        self._by_request.clear()
        self.client.shutdown()
        self.store.close()
        super().closeEvent(event)


def _title_from(text: str, limit: int = 40) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def apply_style(app: QApplication) -> None:
    """The dark theme (assets/style.qss) and the app icon."""
    app.setStyleSheet((ASSETS_DIR / "style.qss").read_text())
    icon = ASSETS_DIR / "kvscope.png"
    if icon.is_file():  # drawn by packaging/make_icons.py
        app.setWindowIcon(QIcon(str(icon)))


def run_window(demo: int | None = None, screenshot: str | None = None) -> int:
    app = QApplication.instance() or QApplication([])
    app.setApplicationName("KVScope")
    apply_style(app)
    if demo:
        from app.demo import run_demo

        return run_demo(app, demo, screenshot)
    window = MainWindow()
    window.show()
    if screenshot:  # a picture of the window with the model loaded, then exit

        def grab(_info) -> None:
            app.exit(0 if window.grab().save(screenshot) else 1)
            window.close()

        window.engine_ready.connect(grab)
        window.engine_failed.connect(lambda _message: (window.close(), app.exit(1)))
    return app.exec()
