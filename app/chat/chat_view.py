"""ChatView: one conversation's messages (markdown bubbles), its system prompt, the composer.

The view holds no state of its own beyond what it draws: the window hands it the stored
messages plus the reply in flight, and it reports what the user asks for through signals.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.markdown import SafeDocument, render_markdown
from app.chat.sampling_panel import SamplingPanel
from app.chat.store import Conversation, Message


def format_metrics(metrics: dict) -> str:
    """'TTFT 0.42 s · 12.3 tok/s · prompt 35 tok (16 cached) · 48 tok' from a reply's metrics."""
    parts = []
    if metrics.get("ttft_s") is not None:
        parts.append(f"TTFT {metrics['ttft_s']:.2f} s")
    if metrics.get("tokens_per_s") is not None:
        parts.append(f"{metrics['tokens_per_s']:.1f} tok/s")
    if "prompt_tokens" in metrics:
        parts.append(
            f"prompt {metrics['prompt_tokens']} tok ({metrics.get('cached_tokens', 0)} cached)"
        )
    if "generated_tokens" in metrics:
        parts.append(f"{metrics['generated_tokens']} tok")
    if metrics.get("dropped_turns"):
        parts.append(f"{metrics['dropped_turns']} oldest turn(s) left out to fit")
    if metrics.get("finish_reason") == "length":
        parts.append("hit max tokens")
    return " · ".join(parts)


LINK_SCHEMES = ("http", "https")


def open_link(url: QUrl) -> bool:
    """Open an http(s) link in the browser once the user agrees; anything else is refused.
    Returns whether it was opened."""
    scheme = url.scheme().lower()
    shown = url.toString()
    if scheme not in LINK_SCHEMES:
        QMessageBox.information(
            None,
            "Link not opened",
            f"KVScope opens only http and https links from chats.\n\n{shown}",
        )
        return False
    answer = QMessageBox.question(None, "Open link?", f"Open this link in your browser?\n\n{shown}")
    if answer != QMessageBox.StandardButton.Yes:
        return False
    return QDesktopServices.openUrl(url)


class MarkdownView(QTextBrowser):
    """A read-only markdown block as tall as its text: the scroll area around it scrolls."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # A click never navigates the bubble (a file:// link would replace it with the file) and
        # never goes straight to the OS: `open_link` asks first, and only for http(s).
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(open_link)
        self.setDocument(SafeDocument(self))
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._markdown = ""

    def set_markdown(self, text: str) -> None:
        if text != self._markdown:
            self._markdown = text
            render_markdown(self.document(), text)

    def markdown(self) -> str:
        return self._markdown

    def loadResource(self, kind: int, url: QUrl):  # noqa: N802 (Qt's name)
        """Chat content loads nothing: no file, no network, whatever the markdown says."""
        return None

    def _fit(self, size) -> None:
        self.setFixedHeight(math.ceil(size.height()) + 2 * self.frameWidth())


class ElidedLabel(QLabel):
    """One line that ends in "…" when it does not fit, and never widens its column."""

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self._full = ""
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self.setToolTip(text)
        self._elide()

    def text(self) -> str:
        return self._full

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.ElideRight, max(self.width(), 40))
        super().setText(shown)


class MessageBubble(QFrame):
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal()
    alternative_selected = Signal(int, int)  # message id (-1 while streaming), index

    def __init__(self, role: str, message_id: int | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.message_id = message_id
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.who = QLabel("You" if role == "user" else "Assistant", objectName="bubbleRole")
        self.status = QLabel(objectName="bubbleStatus")
        self.prev_alt = QToolButton(text="‹", objectName="altButton")
        self.alt_label = QLabel(objectName="altLabel")
        self.next_alt = QToolButton(text="›", objectName="altButton")
        self.copy = QToolButton(text="Copy", objectName="bubbleAction")
        self.edit = QToolButton(text="Edit", objectName="bubbleAction")
        self.regenerate = QToolButton(text="Regenerate", objectName="bubbleAction")
        self.body = MarkdownView()
        self.metrics = QLabel(objectName="bubbleMetrics", wordWrap=True)
        header = QHBoxLayout()
        header.setSpacing(6)
        for w in (self.who, self.status):
            header.addWidget(w)
        header.addStretch(1)
        for w in (self.prev_alt, self.alt_label, self.next_alt, self.copy, self.edit):
            header.addWidget(w)
        header.addWidget(self.regenerate)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.body)
        layout.addWidget(self.metrics)
        self._alternatives: list[str] = []
        self._selected = 0
        self.edit.setVisible(role == "user" and message_id is not None)
        self.regenerate.setVisible(False)
        self.copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.body.markdown()))
        self.edit.clicked.connect(lambda: self.edit_requested.emit(self.message_id))
        self.regenerate.clicked.connect(self.regenerate_requested)
        self.prev_alt.clicked.connect(lambda: self._step_alternative(-1))
        self.next_alt.clicked.connect(lambda: self._step_alternative(1))

    def set_content(
        self,
        text: str,
        status: str = "complete",
        alternatives: list[str] | None = None,
        selected: int = 0,
        metrics: dict | None = None,
    ) -> None:
        self._alternatives = list(alternatives or [])
        self._selected = selected
        shown = self._alternatives[selected] if self._alternatives else text
        self.body.set_markdown(shown or ("…" if status == "generating" else ""))
        labels = {"stopped": "stopped", "error": "error", "generating": "generating…"}
        self.status.setText(labels.get(status, ""))
        self.status.setProperty("state", status)
        many = len(self._alternatives) > 1
        for w in (self.prev_alt, self.alt_label, self.next_alt):
            w.setVisible(many)
        if many:
            self.alt_label.setText(f"{selected + 1}/{len(self._alternatives)}")
            self.prev_alt.setEnabled(selected > 0)
            self.next_alt.setEnabled(selected < len(self._alternatives) - 1)
        self.metrics.setText(format_metrics(metrics or {}))
        self.metrics.setVisible(bool(metrics))

    def set_editable(self, on: bool) -> None:
        self.edit.setEnabled(on)

    def set_regenerable(self, on: bool) -> None:
        self.regenerate.setVisible(on)

    def _step_alternative(self, delta: int) -> None:
        index = self._selected + delta
        if 0 <= index < len(self._alternatives):
            mid = self.message_id if self.message_id is not None else -1
            self.alternative_selected.emit(mid, index)


class ComposerEdit(QPlainTextEdit):
    """Enter sends, Shift+Enter breaks the line, Escape cancels an edit."""

    submitted = Signal()
    cancelled = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        if (
            event.key() in (Qt.Key_Return, Qt.Key_Enter)
            and not event.modifiers() & Qt.ShiftModifier
        ):
            self.submitted.emit()
            return
        if event.key() == Qt.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)


class ChatView(QWidget):
    send_requested = Signal(str, int)  # text, id of the user message being edited (-1: new)
    stop_requested = Signal()
    regenerate_requested = Signal()
    alternative_selected = Signal(int, int)  # message id (-1: the reply in flight), index
    system_prompt_changed = Signal(int, str)  # conversation id, text

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        self.title = ElidedLabel("No chat selected", objectName="chatTitle")
        self.system_toggle = QToolButton(text="System prompt", checkable=True)
        self.sampling_toggle = QToolButton(text="Sampling", checkable=True)
        self.system_prompt = QPlainTextEdit(objectName="systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional)")
        self.system_prompt.setMaximumHeight(90)
        self.system_prompt.setVisible(False)
        self.sampling = SamplingPanel()
        self.sampling.setVisible(False)

        self.messages = QWidget(objectName="messageList")
        self.message_layout = QVBoxLayout(self.messages)
        self.message_layout.setContentsMargins(12, 12, 12, 12)
        self.message_layout.setSpacing(10)
        self.message_layout.addStretch(1)
        self.scroll = QScrollArea(widgetResizable=True, objectName="messageScroll")
        self.scroll.setWidget(self.messages)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.empty = QLabel(
            "Start a conversation: type below and press Enter.", objectName="emptyHint"
        )
        self.empty.setAlignment(Qt.AlignCenter)
        self.message_layout.insertWidget(0, self.empty)
        self.notice = QLabel(objectName="chatNotice", wordWrap=True)
        self.notice.setVisible(False)

        self.edit_banner = QLabel(objectName="editBanner")
        self.edit_banner.setVisible(False)
        self.composer = ComposerEdit(objectName="composer")
        self.composer.setPlaceholderText("Message the model — Enter to send, Shift+Enter newline")
        self.composer.setMaximumHeight(96)
        self.send = QPushButton("Send", objectName="sendButton")
        self.stop = QPushButton("Stop", objectName="stopButton")
        self.stop.setVisible(False)

        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.system_toggle)
        header.addWidget(self.sampling_toggle)
        composer_row = QHBoxLayout()
        composer_row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send)
        buttons.addWidget(self.stop)
        buttons.addStretch(1)
        composer_row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(header)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(self.notice)
        layout.addWidget(self.sampling)
        layout.addWidget(self.edit_banner)
        layout.addLayout(composer_row)

        self._bubbles: list[MessageBubble] = []
        self._pending: MessageBubble | None = None
        self._conversation_id = -1
        self._editing = -1
        self._generating = False
        self._system_timer = QTimer(self, singleShot=True, interval=400)
        self._system_timer.timeout.connect(self._flush_system_prompt)
        self.system_toggle.toggled.connect(self.system_prompt.setVisible)
        self.sampling_toggle.toggled.connect(self.sampling.setVisible)
        self.system_prompt.textChanged.connect(self._system_timer.start)
        self.composer.submitted.connect(self._submit)
        self.composer.cancelled.connect(self.cancel_edit)
        self.send.clicked.connect(self._submit)
        self.stop.clicked.connect(self.stop_requested)
        self.scroll.verticalScrollBar().rangeChanged.connect(self._follow_bottom)
        self._at_bottom = True
        self.scroll.verticalScrollBar().valueChanged.connect(self._track_bottom)

    # ---- what the window tells it --------------------------------------------------------
    def set_conversation(self, conversation: Conversation | None, messages: list[Message]) -> None:
        if self._system_timer.isActive():  # an edit still waiting to be saved: save it first
            self._system_timer.stop()
            self._flush_system_prompt()
        self._conversation_id = conversation.id if conversation else -1
        self.cancel_edit()
        self.clear_notice()
        for bubble in self._bubbles:
            # Out of the layout now; the object itself goes when the event loop runs.
            self.message_layout.removeWidget(bubble)
            bubble.hide()
            bubble.deleteLater()
        self._bubbles, self._pending = [], None
        self.title.setText(conversation.title if conversation else "New chat")
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(conversation.system_prompt if conversation else "")
        self.system_prompt.blockSignals(False)
        if conversation and conversation.system_prompt:
            self.system_toggle.setChecked(True)
        for msg in messages:
            bubble = MessageBubble(msg.role, msg.id)
            bubble.set_content(msg.content, msg.status, msg.alternatives, msg.selected, msg.metrics)
            self._add_bubble(bubble)
        self.empty.setVisible(not messages)
        self._at_bottom = True
        self._refresh_actions()

    def start_pending(self) -> None:
        """Show an empty assistant bubble for the reply in flight."""
        self._pending = MessageBubble("assistant", None)
        self._pending.set_content("", "generating")
        self._add_bubble(self._pending)
        self._refresh_actions()

    def update_pending(self, texts: list[str], selected: int, metrics: dict | None) -> None:
        if self._pending is None:
            self.start_pending()
        alternatives = texts if len(texts) > 1 else None
        self._pending.set_content(
            texts[0] if texts else "", "generating", alternatives, selected, metrics
        )

    def finish_pending(self, message: Message) -> None:
        """The reply in flight was stored: its bubble becomes that message (no full redraw)."""
        if self._pending is None:
            return
        bubble, self._pending = self._pending, None
        bubble.message_id = message.id
        bubble.set_content(
            message.content,
            message.status,
            message.alternatives,
            message.selected,
            message.metrics,
        )

    def set_generating(self, on: bool) -> None:
        self._generating = on
        self.send.setVisible(not on)
        self.stop.setVisible(on)
        self._refresh_actions()

    def show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(True)

    def clear_notice(self) -> None:
        self.notice.setVisible(False)

    def begin_edit(self, message_id: int, text: str) -> None:
        self._editing = message_id
        self.composer.setPlainText(text)
        self.composer.setFocus()
        self.edit_banner.setText("Editing a message: sending replaces everything after it (Esc)")
        self.edit_banner.setVisible(True)

    def cancel_edit(self) -> None:
        if self._editing >= 0:
            self.composer.clear()
        self._editing = -1
        self.edit_banner.setVisible(False)

    def bubbles(self) -> list[MessageBubble]:
        return list(self._bubbles)

    # ---- internals -----------------------------------------------------------------------
    def _add_bubble(self, bubble: MessageBubble) -> None:
        bubble.edit_requested.connect(self._edit_clicked)
        bubble.regenerate_requested.connect(self.regenerate_requested)
        bubble.alternative_selected.connect(self.alternative_selected)
        self.message_layout.insertWidget(self.message_layout.count() - 1, bubble)
        self._bubbles.append(bubble)
        self.empty.setVisible(False)

    def _refresh_actions(self) -> None:
        for bubble in self._bubbles:
            bubble.set_editable(not self._generating)
            bubble.set_regenerable(False)
        if self._bubbles and not self._generating:
            # The last turn can be redone: a reply, or a user message whose reply failed.
            self._bubbles[-1].set_regenerable(True)

    def _edit_clicked(self, message_id: int) -> None:
        bubble = next(b for b in self._bubbles if b.message_id == message_id)
        self.begin_edit(message_id, bubble.body.markdown())

    def _submit(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or self._generating:
            return
        # The text stays in the composer until the window has stored it (`message_sent`): a
        # message the disk could not take is never lost.
        self.send_requested.emit(text, self._editing)

    def message_sent(self) -> None:
        """The submitted message is stored: clear the composer and any edit in progress."""
        self.composer.clear()
        self._editing = -1
        self.edit_banner.setVisible(False)

    def _flush_system_prompt(self) -> None:
        if self._conversation_id >= 0:
            self.system_prompt_changed.emit(self._conversation_id, self.system_prompt.toPlainText())

    def _track_bottom(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        self._at_bottom = value >= bar.maximum() - 4

    def _follow_bottom(self, _low: int, high: int) -> None:
        if self._at_bottom:
            self.scroll.verticalScrollBar().setValue(high)
