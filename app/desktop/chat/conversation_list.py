"""ConversationList: search, new, rename, delete, export; shows which chats are generating.

Titles are shown as plain text (a title made from a first message may hold markdown), and a
search that matches nothing says so rather than leaving an empty list.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.core.request_ids import conversation_group
from kvscope.app.desktop.blockmap.colors import group_hex
from kvscope.app.desktop.chat.export import (
    export_chat,
    export_folder,
    remember_export_folder,
    suggested_file_name,
)
from kvscope.app.desktop.chat.markdown import plain_text
from kvscope.app.desktop.chat.store import ChatStore

GENERATING_MARK = "● "


def group_swatch(group: str, size: int = 10) -> QIcon:
    """A dot in the group's block-map colour, so a chat and its blocks match."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(group_hex(group)))
    painter.drawEllipse(0, 0, size, size)
    painter.end()
    return QIcon(pixmap)


class ConversationList(QWidget):
    conversation_selected = Signal(int)  # conversation id
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)

    def __init__(self, store: ChatStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationList")
        self.store = store
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("newChat")
        self.search = QLineEdit(placeholderText="Search chats", clearButtonEnabled=True)
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.no_results = QLabel(wordWrap=True)
        self.no_results.setObjectName("emptyHint")
        self.no_results.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self.no_results.setVisible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.no_results)
        layout.addWidget(self.list, 1)
        self._generating: dict[int, QColor | None] = {}
        self._current: int | None = None
        # A reply that starts or ends moves its chat to the top; under the pointer that moved
        # the row about to be clicked. While the pointer is over the list the rows keep their
        # order (labels still change) and the list re-sorts when it leaves.
        self._pointer_inside = False
        self._resort_due = False
        self.list.installEventFilter(self)

        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(lambda _text: self.refresh())
        self.list.currentItemChanged.connect(self._item_changed)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.itemDoubleClicked.connect(
            lambda item: self.ask_rename(item.data(Qt.ItemDataRole.UserRole))
        )

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.list and event.type() == QEvent.Type.Enter:
            self._pointer_inside = True
        elif watched is self.list and event.type() == QEvent.Type.Leave:
            self._pointer_inside = False
            if self._resort_due:
                self.refresh()
        return super().eventFilter(watched, event)

    def refresh(self) -> None:
        """Reload from the store, keeping the selection."""
        self._resort_due = False
        self.list.blockSignals(True)
        self.list.clear()
        conversations = self.store.conversations(self.search.text())
        for conv in conversations:
            title = plain_text(conv.title) or conv.title
            item = QListWidgetItem()
            item.setIcon(group_swatch(conversation_group(conv.id)))
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(title)
            self._mark(item)
            self.list.addItem(item)
            if conv.id == self._current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        searching = self.search.text().strip()
        self.no_results.setText(f"No chats match “{searching}”")
        self.no_results.setVisible(bool(searching) and not conversations)

    def _mark(self, item: QListWidgetItem) -> None:
        """The item's text and colour: its title, marked while its chat generates."""
        cid = item.data(Qt.ItemDataRole.UserRole)
        item.setText((GENERATING_MARK if cid in self._generating else "") + item.toolTip())
        color = self._generating.get(cid)
        item.setForeground(color if color is not None else self.list.palette().text())

    def select(self, conversation_id: int | None) -> None:
        self._current = conversation_id
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == conversation_id:
                self.list.blockSignals(True)
                self.list.setCurrentItem(item)
                self.list.blockSignals(False)
                return
        self.list.clearSelection()

    def set_generating(self, conversation_id: int, on: bool, color: QColor | None = None) -> None:
        if on:
            self._generating[conversation_id] = color
        else:
            self._generating.pop(conversation_id, None)
        if not self._pointer_inside:
            self.refresh()
            return
        self._resort_due = True
        for row in range(self.list.count()):  # in place: the marks change, not the order
            self._mark(self.list.item(row))

    def ask_rename(self, conversation_id: int) -> None:
        title = self.store.conversation(conversation_id).title
        new, ok = QInputDialog.getText(self, "Rename chat", "Title", text=title)
        if ok and new.strip():
            self.rename_requested.emit(conversation_id, new.strip())

    def ask_delete(self, conversation_id: int) -> None:
        title = self.store.conversation(conversation_id).title
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conversation_id)

    def ask_export(self, conversation_id: int, fmt: str) -> None:
        """Ask where to write the chat ("markdown" or "json") and write it there."""
        title = self.store.conversation(conversation_id).title
        kind = "Markdown (*.md)" if fmt == "markdown" else "JSON (*.json)"
        start = export_folder() / suggested_file_name(plain_text(title), fmt)
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(start), kind)
        if not path:
            return
        try:
            export_chat(self.store, conversation_id, path, fmt)
        except OSError as e:
            QMessageBox.warning(self, "The chat was not exported", f"{path}: {e}")
            return
        remember_export_folder(path)

    def _item_changed(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None:
            self._current = item.data(Qt.ItemDataRole.UserRole)
            self.conversation_selected.emit(self._current)

    def _context_menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is not None:
            self.menu_for(item.data(Qt.ItemDataRole.UserRole)).exec(self.list.mapToGlobal(pos))

    def menu_for(self, conversation_id: int) -> QMenu:
        """The context menu of one chat: rename, export, delete."""
        menu = QMenu(self)
        rename = QAction("Rename…", menu)
        rename.triggered.connect(lambda: self.ask_rename(conversation_id))
        delete = QAction("Delete…", menu)
        delete.triggered.connect(lambda: self.ask_delete(conversation_id))
        markdown = QAction("Export as Markdown…", menu)
        markdown.triggered.connect(lambda: self.ask_export(conversation_id, "markdown"))
        as_json = QAction("Export as JSON…", menu)
        as_json.triggered.connect(lambda: self.ask_export(conversation_id, "json"))
        menu.addActions([rename, markdown, as_json])
        menu.addSeparator()
        menu.addAction(delete)
        return menu
