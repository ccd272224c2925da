"""MainWindow: conversations, the chat, and the KV block map over one engine worker.

The window builds the widgets and wires them: the chats' behaviour is the ChatController's
(app/desktop/chat/controller.py), the engine lives in the worker thread behind an EngineClient
(app/desktop/engine_thread/client.py), the status bar formats what the engine reports
(app/desktop/status_bar.py), and the map column holds the block map over the load generator
(app/desktop/map_column.py). The window itself keeps the settings, feeds telemetry to the block map,
and shows errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QMainWindow,
    QMessageBox,
    QSplitter,
    QTabWidget,
)

from kvscope.app.core.engine_messages import EngineInfo, Telemetry
from kvscope.app.core.paths import data_dir
from kvscope.app.core.request_ids import conversation_of_group, group_of
from kvscope.app.core.settings import (
    AppSettings,
    EngineSettings,
    load_settings,
    save_settings,
    settings_path,
)
from kvscope.app.desktop.chat.chat_view import ChatView
from kvscope.app.desktop.chat.controller import ChatController
from kvscope.app.desktop.chat.conversation_list import ConversationList
from kvscope.app.desktop.chat.recovery import open_chat_store
from kvscope.app.desktop.chat.store import default_store_path
from kvscope.app.desktop.engine_thread.client import EngineClient
from kvscope.app.desktop.get_model.controls import GetModelControls
from kvscope.app.desktop.map_column import MapColumn
from kvscope.app.desktop.models.discovery import remember_model
from kvscope.app.desktop.models.headers import prefetch as prefetch_headers
from kvscope.app.desktop.recording.controls import RecordingControls
from kvscope.app.desktop.remote_view.connect_dialog import add_connect_action
from kvscope.app.desktop.remote_view.view import RemoteView
from kvscope.app.desktop.server_controls import ServerControls
from kvscope.app.desktop.settings.dialog import SettingsDialog
from kvscope.app.desktop.status_bar import EngineStatusBar
from kvscope.app.desktop.theme import theme_keeper
from kvscope.app.desktop.whatif import WhatIfTab
from kvscope.app.desktop.window_geometry import first_sizes, initial_size
from kvscope.app.desktop.window_menu import add_engine_actions, build_menus
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.connections_qt import ConnectionList


class MainWindow(QMainWindow):
    engine_ready = Signal(object)  # EngineInfo, after the first load and every rebuild
    engine_failed = Signal(str)
    telemetry_received = Signal(object)  # Telemetry
    error_shown = Signal(str)  # every error the window reports in a dialog

    def __init__(
        self,
        settings: AppSettings | None = None,
        loaded_model=None,
        store_path=None,
        persist_settings: bool = True,
        connections: Sequence[Connection] = (),
    ) -> None:
        """`connections`: remote servers to watch and chat with (kvscope --connect)."""
        super().__init__()
        self.setWindowTitle("KVScope")
        self.resize(*initial_size(self.screen().availableGeometry()))
        self._persist_settings = persist_settings
        self.last_error: str | None = None
        # The EngineSettings of the last Apply, and (them, why) while they failed to build.
        self._attempted_engine: EngineSettings | None = None
        self._failed_engine: tuple[EngineSettings, str] | None = None
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
        self._map_paused = False
        self._quit_confirmed = False
        self._telemetry_due = False
        self.connections = ConnectionList(self)  # remote servers: app/remote/
        for connection in connections:
            self.connections.add(connection)

        # Before the layout: its fixed heights come from the styled widgets.
        self.theme = theme_keeper()
        self.theme.apply(self.settings.theme)
        self._build_layout()
        self.status = EngineStatusBar(self)
        self.setStatusBar(self.status)
        self.client = EngineClient(settings.engine, loaded_model)
        self.chats = ChatController(
            self.store,
            self.chat,
            self.conversations,
            self.client,
            overflow_policy=lambda: self.settings.overflow_policy,
            default_sampling=lambda: self.settings.sampling,
            parent=self,
            connections=self.connections,  # chats may run on a connection's model
        )
        self.chats.in_flight_changed.connect(self._update_state)
        self.chats.group_labels_changed.connect(self.blockmap.set_group_labels)
        self.chats.error_raised.connect(self.show_error)
        self.chats.notice_raised.connect(self._show_notice)
        self.chat.sampling.defaults_requested.connect(self._sampling_defaults_chosen)
        self.menus = build_menus(
            self,
            new_chat=self.chats.new_chat_requested,
            delete_chat=self.delete_current_chat,
            export_chat=self.export_current_chat,
            open_settings=self.open_settings,
            set_map_paused=self.set_map_paused,
            set_theme=self.set_theme,
            request_quit=self.request_quit,
            delete_scope=self.conversations,
        )
        self.menus.themes[self.settings.theme].setChecked(True)
        self.recording = RecordingControls(self, self.client, self.show_error, self._show_notice)
        add_engine_actions(self, self.recording.actions())
        self.server = ServerControls(self, self.client, self.show_error, self._show_notice)
        add_engine_actions(self, self.server.actions())
        self.connect_action = add_connect_action(self, self.connections)
        self.whatif = WhatIfTab(self)  # Engine > What if…: a tab beside "This engine"
        self.get_model = GetModelControls(self)  # Engine > Get a model…, the first-run offer
        self.status.addPermanentWidget(self.recording.button)
        self._connect_engine()
        self.client.start()

        self.conversations.refresh()
        existing = self.store.conversations()
        self.chats.open_conversation(existing[0].id if existing else None)
        self.chats.refresh_group_labels()
        if settings_problem:
            self.show_error("Settings were reset", settings_problem)
        if store_problem:
            self.show_error("The chats database could not be used as it was", store_problem)
        from kvscope.app.core import paths

        if paths.data_dir_problem:
            self.show_error("The data folder cannot be used", paths.data_dir_problem)

    # ---- layout ---------------------------------------------------------------------------
    def _build_layout(self) -> None:
        self.conversations = ConversationList(self.store)
        self.chat = ChatView()
        self.chat.sampling.set_settings(self.settings.sampling)
        right = MapColumn()
        self.map_column = right
        self.blockmap = right.blockmap
        self.loadgen_panel = right.loadgen_panel
        self.loadgen_toggle = right.loadgen_toggle

        # The local engine's map, and beside it (a tab) what connected servers' caches hold.
        # The tab bar shows once there is a connection, so the window without one keeps the
        # block map's full height.
        self.remote_view = RemoteView(self.connections, parent=self)
        self.remote_view.hide()
        self.map_tabs = QTabWidget(documentMode=True, tabBarAutoHide=True)
        self.map_tabs.setObjectName("mapTabs")
        self.map_tabs.addTab(right, "This engine")
        self._show_remote_tab()
        self.connections.changed.connect(self._show_remote_tab)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.chat)
        splitter.addWidget(self.map_tabs)
        splitter.setStretchFactor(1, 2)
        splitter.setStretchFactor(2, 3)
        self.splitter = splitter
        self._sized = False
        self.setCentralWidget(splitter)

    def _show_remote_tab(self) -> None:
        """The remote view's tab exists while there are connections, and a new one shows it."""
        index = self.map_tabs.indexOf(self.remote_view)
        if len(self.connections) and index < 0:
            self.map_tabs.addTab(self.remote_view, "Remote servers")
            self.map_tabs.setCurrentWidget(self.remote_view)
        elif not len(self.connections) and index >= 0:
            self.map_tabs.removeTab(index)

    def _connect_engine(self) -> None:
        # Bound methods of this window only: a lambda would run in the worker's thread.
        self.client.engine_ready.connect(self._on_engine_ready)
        self.client.engine_failed.connect(self._on_engine_failed)
        self.client.busy.connect(self._on_busy)
        self.client.build_progress.connect(self.status.show_progress)
        self.client.kernel_status.connect(self.status.show_kernels)
        self.client.telemetry.connect(self._on_telemetry)
        self.client.error.connect(self._on_engine_error)
        self.client.load_status.connect(self._on_load_status)
        # Hovering a block asks the worker for its tokens (block_contents); the answer comes
        # back as a signal and goes to the panel, which updates its hover card.
        self.blockmap.set_block_info_provider(self.client.query_block)
        self.client.block_info.connect(self._on_block_info)
        self.blockmap.sequence_selected.connect(self._sequence_selected)
        self.loadgen_panel.start_requested.connect(self.client.start_load)
        self.loadgen_panel.stop_requested.connect(self.client.stop_load)
        self.client.speed.connect(self.loadgen_panel.set_speed)
        self.loadgen_panel.pool_requested.connect(self._use_kv_pool)

    # ---- settings -------------------------------------------------------------------------
    def open_settings(self) -> SettingsDialog:
        # After a failed rebuild it starts from what was chosen, not from what was restored.
        dialog = SettingsDialog(
            self.settings, self, running=self.engine_info, failed=self._failed_engine
        )
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings()))
        dialog.open()
        return dialog

    def apply_settings(self, settings: AppSettings) -> None:
        """Adopt new settings; engine knobs rebuild the engine in the worker (chats survive)."""
        settings.sampling = self.settings.sampling  # chosen in the chat since the dialog opened
        rebuild = settings.engine != self.settings.engine
        self.settings = settings
        if rebuild:
            self._attempted_engine = settings.engine
            self.client.apply_settings(settings.engine)
        self._save_settings()

    def _use_kv_pool(self, mib: int) -> None:
        """The preemption preset's smaller pool: a rebuild, saved as a choice in Settings is."""
        engine = dataclasses.replace(self.settings.engine, kv_budget_mib=mib)
        self.apply_settings(dataclasses.replace(self.settings, engine=engine))

    def _sampling_defaults_chosen(self, sampling) -> None:
        """New chats start from these; each chat keeps its own (ChatController)."""
        self.settings.sampling = sampling
        self._save_settings()
        self.status.showMessage("New chats will start from these sampling settings", 5_000)

    def _save_settings(self) -> None:
        if self._persist_settings:
            try:
                save_settings(self.settings)
            except OSError as e:
                self.status.showMessage(f"Could not save {settings_path()}: {e}", 10_000)

    # ---- engine ---------------------------------------------------------------------------
    def _on_engine_ready(self, info: EngineInfo) -> None:
        self.engine_info = info
        if info.settings == self._attempted_engine:
            self._failed_engine = None  # what was chosen now runs
        # After a failed rebuild the worker restores the old engine: keep settings in step.
        self.settings.engine = info.settings
        if info.settings.model:  # the model picker lists it under Recent
            remember_model(data_dir(), info.settings.model)
        prefetch_headers(info.settings.model)  # the settings dialog then opens reading nothing
        self.status.show_engine(info)
        self.loadgen_panel.set_engine_info(info)  # lengths within this context, preset sized
        self._update_state()
        self.engine_ready.emit(info)

    def _on_engine_failed(self, message: str) -> None:
        if self._attempted_engine is not None:
            self._failed_engine = (self._attempted_engine, message)
        if self.engine_info is not None:
            self.settings.engine = self.engine_info.settings
            self._save_settings()
        self.show_error("The engine could not be built", message)
        self._update_state()
        self.engine_failed.emit(message)

    def _on_engine_error(self, message: str) -> None:
        self.show_error("Engine error", message)

    def _on_busy(self, text: str) -> None:
        self.status.show_busy(text)
        if not text:
            self._update_state()

    def _update_state(self) -> None:
        self.status.show_state(self.engine_info is not None, len(self.chats.pending))

    def _on_telemetry(self, telemetry: Telemetry) -> None:
        # Only the newest matters: if the GUI fell behind, queued older ones are skipped.
        self.last_telemetry = telemetry
        if not self._telemetry_due:
            self._telemetry_due = True
            QTimer.singleShot(0, self, self._show_telemetry)  # dropped if the window is deleted

    def _show_telemetry(self) -> None:
        self._telemetry_due = False
        telemetry = self.last_telemetry
        assert telemetry is not None  # _on_telemetry sets it before it schedules this
        self.status.show_pool(telemetry.stats)
        if not self._map_paused:
            self.blockmap.update_view(
                telemetry.paged, telemetry.shadow, telemetry.stats, telemetry.device_memory
            )
        self.telemetry_received.emit(telemetry)

    def _on_load_status(self, running: bool, line: str) -> None:
        self.loadgen_panel.set_running(running)
        self.loadgen_panel.set_status(line)

    # ---- block map ------------------------------------------------------------------------
    def _on_block_info(self, block_id: int, contents: dict) -> None:
        self.blockmap.show_block_info(block_id, contents)

    def _sequence_selected(self, seq_id: int) -> None:
        """Selecting a chat's sequence on the map opens that chat."""
        snapshot = self.last_telemetry.paged if self.last_telemetry else None
        info = snapshot.sequence(seq_id) if snapshot is not None else None
        if info is None:
            return
        conversation_id = conversation_of_group(group_of(info.request_id))
        if conversation_id is not None and conversation_id != self.chats.current_id:
            self.chats.open_conversation(conversation_id)

    def set_map_paused(self, paused: bool) -> None:
        """Stop (or resume) feeding the block map; the status bar keeps counting."""
        self._map_paused = paused
        self.menus.pause_map.setChecked(paused)

    # ---- chats and view -------------------------------------------------------------------
    def delete_current_chat(self) -> None:
        """The Delete key in the chat list: the open chat, after the list's confirmation."""
        if self.chats.current_id is not None:
            self.conversations.ask_delete(self.chats.current_id)

    def export_current_chat(self, fmt: str) -> None:
        """Chat > Export: the open chat as "markdown" or "json", to a file the user picks."""
        if self.chats.current_id is not None:
            self.conversations.ask_export(self.chats.current_id, fmt)

    def set_theme(self, choice: str) -> None:
        """A View > Theme choice: applied now and kept in the settings."""
        self.settings.theme = choice
        self.theme.apply(choice)
        self.menus.themes[choice].setChecked(True)
        self._save_settings()

    # ---- errors and closing ---------------------------------------------------------------
    def _show_notice(self, line: str) -> None:
        self.status.showMessage(line, 10_000)

    def show_error(self, title: str, message: str) -> None:
        """A non-blocking error dialog plus the status bar; the app keeps running."""
        self.last_error = message
        self.status.showMessage(f"{title}: {message.splitlines()[0]}", 15_000)
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self._error_box = box
        self.error_shown.emit(message)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not self._sized:  # before the first show the splitter would redistribute them
            self._sized = True
            self.splitter.setSizes(self._first_sizes())

    def _first_sizes(self) -> list[int]:
        return first_sizes(
            self.width(),
            self.conversations.minimumSizeHint().width(),
            self.map_tabs.minimumSizeHint().width(),
        )

    def confirm_quit(self) -> bool:
        """True when nothing is generating, or the user agrees to stop the replies in flight."""
        n = len(self.chats.pending)
        if not n:
            return True
        replies = "A reply is" if n == 1 else f"{n} replies are"
        answer = QMessageBox.question(
            self,
            "Quit KVScope",
            f"{replies} still being generated. Quit anyway? What is written so far is kept.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def request_quit(self) -> None:
        """The Quit action: asks first while replies stream."""
        if self.confirm_quit():
            self._quit_confirmed = True
            self.close()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        # The window manager's close button asks too; a close() from code (tests, the
        # screenshot) does not.
        if event.spontaneous() and not self._quit_confirmed and not self.confirm_quit():
            event.ignore()
            return
        self.chats.keep_in_flight_as_stopped()
        self.remote_view.shutdown()
        self.whatif.close()
        self.client.shutdown()
        self.store.close()
        super().closeEvent(event)
