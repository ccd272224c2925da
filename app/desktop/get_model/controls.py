"""GetModelControls: the main window's ways into the Get a model window, and its way back.

In: Engine ▸ Get a model… (right after Model and engine…), the model picker's "Get a model…"
button (it triggers this action, found by its object name: app/desktop/models/picker.py), and
the first-run offer under an empty chat while the bundled model runs
(app/desktop/get_model/first_run.py). Back: a finished download's Open loads the model through
ModelOpener, as the settings dialog's Apply does. The window is made on first use (its hub code
imports huggingface_hub, which the app's start need not pay for) and lives with the main
window; closing it hides it while downloads go on. When the app quits, downloads pause: their
verified bytes stay in the cache for the next start to resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QCoreApplication, QObject, QTimer
from PySide6.QtGui import QAction

from kvscope.app.desktop.get_model.first_run import FirstRunOffer
from kvscope.app.desktop.get_model.model_opener import ModelOpener
from kvscope.app.desktop.window_menu import add_model_action

if TYPE_CHECKING:
    from kvscope.app.core.engine_messages import EngineInfo
    from kvscope.app.core.hub.search import HubFile
    from kvscope.app.desktop.get_model.window import GetModelWindow

GET_MODEL_ACTION = "getModelAction"  # the picker finds the action by this name
WINDOW_SIZE = (1180, 760)  # or the screen's free area, where smaller


class GetModelControls(QObject):
    def __init__(self, window) -> None:
        """`window`: the MainWindow (passed in, not imported: it imports this package)."""
        super().__init__(window)
        self.main = window
        self.hub_window: GetModelWindow | None = None
        self.action = QAction("Get a model…", window)
        self.action.setObjectName(GET_MODEL_ACTION)
        self.action.setToolTip("Search the Hugging Face Hub for GGUF models that fit this machine")
        self.action.triggered.connect(self.open)
        add_model_action(window, self.action)
        self.opener = ModelOpener(window)
        chat = window.chat
        self.first_run = FirstRunOffer(chat.empty)
        # Under the empty chat's hint, in the message list (which scrolls when it is long).
        chat.message_layout.insertWidget(
            chat.message_layout.indexOf(chat.empty) + 1, self.first_run
        )
        self.first_run.resized.connect(self._show_offer_top)
        self.first_run.download_requested.connect(self.download)
        self.first_run.browse_requested.connect(self.open)
        window.engine_ready.connect(self._engine_ready)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def open(self) -> GetModelWindow:
        """Show the Get a model window (made on first use), in front."""
        if self.hub_window is None:
            from kvscope.app.desktop.get_model.window import GetModelWindow

            self.hub_window = GetModelWindow(self.main)
            self.hub_window.open_requested.connect(self.opener.open)
            free = self.main.screen().availableGeometry()
            self.hub_window.resize(
                min(WINDOW_SIZE[0], free.width()), min(WINDOW_SIZE[1], free.height())
            )
        self.hub_window.show()
        self.hub_window.raise_()
        self.hub_window.activateWindow()
        return self.hub_window

    def download(self, hub_file: HubFile) -> None:
        """The first-run offer's Download: in the window, whose downloads panel shows it."""
        window = self.open()
        window.choose_repo(hub_file.repo)
        window.download(hub_file)

    def shutdown(self) -> None:
        """The app quits: pause the downloads (their bytes stay to resume next time)."""
        if self.hub_window is not None:
            self.hub_window.shutdown()

    def _show_offer_top(self) -> None:
        """The offer is taller than the chat of a 700 px window, and an empty chat follows its
        bottom as the list grows: show the hint and the offer's headline instead, after the
        chat's own scroll (the next turn of the event loop)."""
        chat = self.main.chat
        QTimer.singleShot(0, self, lambda: chat.message_scroll.ensureWidgetVisible(chat.empty))

    def _engine_ready(self, info: EngineInfo) -> None:
        self.first_run.set_bundled(info.settings.model is None)
