"""ChatView: one conversation's messages (markdown bubbles), its system prompt, the composer.

The view holds no state of its own beyond what it draws: the window hands it the stored
messages plus the reply in flight, and it reports what the user asks for through signals. In a
chat with structured output on, a reply that is JSON is drawn indented (`set_json_replies`).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.chat.backend_picker import BackendPicker
from kvscope.app.desktop.chat.chat_header import ChatHeader
from kvscope.app.desktop.chat.context_meter import ContextMeter
from kvscope.app.desktop.chat.markdown import plain_text
from kvscope.app.desktop.chat.message_bubble import MessageBubble
from kvscope.app.desktop.chat.sampling_panel import SamplingPanel, SamplingScroll
from kvscope.app.desktop.chat.store import Conversation, Message

SAMPLING_SHARE = 0.5  # of the chat's height, at most, for the open sampling panel (then it scrolls)
SAMPLING_MIN_HEIGHT = 120


class ElidedLabel(QLabel):
    """One line that ends in "…" when it does not fit, and never widens its column."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
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
        shown = self.fontMetrics().elidedText(
            self._full, Qt.TextElideMode.ElideRight, max(self.width(), 40)
        )
        super().setText(shown)


class ComposerEdit(QPlainTextEdit):
    """Enter sends, Shift+Enter breaks the line, Escape cancels an edit."""

    submitted = Signal()
    cancelled = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        if (
            event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
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
        self.title = ElidedLabel("No chat selected")
        self.title.setObjectName("chatTitle")
        self.system_toggle = QToolButton()
        self.system_toggle.setText("System prompt")
        self.system_toggle.setCheckable(True)
        self.sampling_toggle = QToolButton()
        self.sampling_toggle.setText("Sampling")
        self.sampling_toggle.setCheckable(True)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional)")
        self.system_prompt.setMaximumHeight(90)
        self.system_prompt.setVisible(False)
        self.sampling = SamplingPanel()
        self.sampling_scroll = SamplingScroll(self.sampling)
        self.sampling_scroll.setVisible(False)

        self.messages = QWidget()
        self.messages.setObjectName("messageList")
        self.message_layout = QVBoxLayout(self.messages)
        self.message_layout.setContentsMargins(12, 12, 12, 12)
        self.message_layout.setSpacing(10)
        self.message_layout.addStretch(1)
        # The bubbles' minimum heights are those of their narrowest width: as the scroll area's
        # floor they left a blank below the last message whenever the list scrolled. With any
        # explicit minimum it takes the list's height for its width instead.
        self.messages.setMinimumHeight(1)
        # Not `scroll`: that name is QWidget.scroll(), which an attribute would shadow.
        self.message_scroll = QScrollArea(widgetResizable=True)
        self.message_scroll.setObjectName("messageScroll")
        self.message_scroll.setWidget(self.messages)
        self.message_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.empty = QLabel("Start a conversation: type below and press Enter.")
        self.empty.setObjectName("emptyHint")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)  # one line was wider than the chat column at 1024 px
        self.message_layout.insertWidget(0, self.empty)
        self.notice = QLabel(wordWrap=True)
        self.notice.setObjectName("chatNotice")
        self.notice.setVisible(False)

        # Entering edit mode must not move the chat: the banner elides rather than widening the
        # column, and keeps its room while hidden, so the rows above the composer never change.
        self.edit_banner = ElidedLabel()
        self.edit_banner.setObjectName("editBanner")
        policy = self.edit_banner.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.edit_banner.setSizePolicy(policy)
        self.edit_banner.setVisible(False)
        self.context_meter = ContextMeter()
        self.backend_picker = BackendPicker()  # hidden until there is a connection
        self.composer = ComposerEdit()
        self.composer.setObjectName("composer")
        self.composer.setPlaceholderText("Message the model — Enter to send, Shift+Enter newline")
        self.composer.setMaximumHeight(96)
        self.send = QPushButton("Send")
        self.send.setObjectName("sendButton")
        self.stop = QPushButton("Stop")
        self.stop.setObjectName("stopButton")
        self.stop.setVisible(False)

        self.header = ChatHeader(self.title, [self.system_toggle, self.sampling_toggle])
        composer_row = QHBoxLayout()
        composer_row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send)
        buttons.addWidget(self.stop)
        buttons.addStretch(1)
        composer_row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.header)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.message_scroll, 1)
        layout.addWidget(self.notice)
        layout.addWidget(self.sampling_scroll)
        above_composer = QHBoxLayout()
        above_composer.addWidget(self.backend_picker)
        above_composer.addWidget(self.edit_banner, 1)
        above_composer.addWidget(self.context_meter, 0, Qt.AlignmentFlag.AlignRight)
        layout.addLayout(above_composer)
        layout.addLayout(composer_row)

        self._bubbles: list[MessageBubble] = []
        self._pending: MessageBubble | None = None
        self._conversation_id = -1
        self._editing = -1
        self._generating = False
        self._json_replies = False
        self._system_timer = QTimer(self, singleShot=True, interval=400)
        self._system_timer.timeout.connect(self._flush_system_prompt)
        self.system_toggle.toggled.connect(self.system_prompt.setVisible)
        self.sampling_toggle.toggled.connect(self.sampling_scroll.setVisible)
        self.system_prompt.textChanged.connect(self._system_timer.start)
        self.composer.submitted.connect(self._submit)
        self.composer.cancelled.connect(self.cancel_edit)
        self.send.clicked.connect(self._submit)
        self.stop.clicked.connect(self.stop_requested)
        self.message_scroll.verticalScrollBar().rangeChanged.connect(self._follow_bottom)
        self._at_bottom = True
        self.message_scroll.verticalScrollBar().valueChanged.connect(self._track_bottom)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        share = max(SAMPLING_MIN_HEIGHT, int(self.height() * SAMPLING_SHARE))
        self.sampling_scroll.setMaximumHeight(share)

    # ---- what the window tells it --------------------------------------------------------
    def set_conversation(self, conversation: Conversation | None, messages: list[Message]) -> None:
        self.flush_system_prompt()  # an edit still waiting to be saved goes to its own chat
        self._conversation_id = conversation.id if conversation else -1
        self.cancel_edit()
        self.clear_notice()
        for bubble in self._bubbles:
            # Out of the layout now; the object itself goes when the event loop runs.
            self.message_layout.removeWidget(bubble)
            bubble.hide()
            bubble.deleteLater()
        self._bubbles, self._pending = [], None
        self.title.setText(plain_text(conversation.title) if conversation else "New chat")
        system_prompt = conversation.system_prompt if conversation else ""
        if system_prompt != self.system_prompt.toPlainText():  # else keep the cursor where it is
            self.system_prompt.blockSignals(True)
            self.system_prompt.setPlainText(system_prompt)
            self.system_prompt.blockSignals(False)
        if conversation and conversation.system_prompt:
            self.system_toggle.setChecked(True)
        for msg in messages:
            bubble = MessageBubble(msg.role, msg.id)
            bubble.set_json_view(self._json_replies)
            bubble.set_content(msg.content, msg.status, msg.alternatives, msg.selected, msg.metrics)
            self._add_bubble(bubble)
        self.empty.setVisible(not messages)
        self._at_bottom = True
        self._refresh_actions()

    def start_pending(self) -> MessageBubble:
        """Show an empty assistant bubble for the reply in flight (and return it)."""
        self._pending = MessageBubble("assistant", None)
        self._pending.set_json_view(self._json_replies)
        self._pending.set_content("", "generating")
        self._add_bubble(self._pending)
        self._refresh_actions()
        return self._pending

    def update_pending(self, texts: list[str], selected: int, metrics: dict | None) -> None:
        pending = self._pending if self._pending is not None else self.start_pending()
        alternatives = texts if len(texts) > 1 else None
        pending.set_content(
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
        self.backend_picker.setEnabled(not on)  # a reply in flight keeps its server
        self.send.setVisible(not on)
        self.stop.setVisible(on)
        self._refresh_actions()

    def set_json_replies(self, on: bool, redraw: bool = True) -> None:
        """Draw replies that are JSON indented, in a code block (the chat's structured output is
        on); `redraw` False: only the bubbles drawn from now on (the chat is about to be)."""
        if on == self._json_replies:
            return
        self._json_replies = on
        if redraw:
            for bubble in self._bubbles:
                bubble.set_json_view(on)

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

    def flush_system_prompt(self) -> None:
        """Save a system-prompt edit still waiting out its delay now: a send must read it."""
        if self._system_timer.isActive():
            self._system_timer.stop()
            self._flush_system_prompt()

    def editing_message_id(self) -> int:
        """The user message being edited in the composer, or -1."""
        return self._editing

    def _flush_system_prompt(self) -> None:
        if self._conversation_id >= 0:
            self.system_prompt_changed.emit(self._conversation_id, self.system_prompt.toPlainText())

    def _track_bottom(self, value: int) -> None:
        bar = self.message_scroll.verticalScrollBar()
        self._at_bottom = value >= bar.maximum() - 4

    def _follow_bottom(self, _low: int, high: int) -> None:
        if self._at_bottom:
            self.message_scroll.verticalScrollBar().setValue(high)
