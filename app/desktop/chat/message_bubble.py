"""MessageBubble: one message of a chat (who, status, the n-sample switcher, actions, metrics).

The bubble draws what it is given; edits, regeneration and switching samples go out as signals.
A reply that is JSON may be drawn indented in a code block (`set_json_view`, for a chat with
structured output on); Copy still copies the text as the model wrote it.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QLabel, QToolButton, QVBoxLayout, QWidget

from kvscope.app.desktop.chat.header_flow import HeaderFlow
from kvscope.app.desktop.chat.markdown_view import MarkdownView
from kvscope.app.desktop.chat.structured_output import json_markdown

# A wait before the engine took the request, said apart from the TTFT once it is this long.
WAIT_SHOWN_S = 0.5


def format_metrics(metrics: dict, selected: int = 0, samples: int = 1) -> str:
    """'TTFT 0.42 s · 12.3 tok/s · prompt 35 tok (16 cached) · 24 tok' from a reply's metrics.

    For a reply of `samples` > 1 samples the token count and the finish are those of sample
    `selected`, the one shown; the rate is the request's, over all its samples. A reply from a
    remote server names it ("via gpu-box:8000 · model") and its TTFT is measured here, network
    included. TTFT counts from Send; a long wait before the engine took the request (the model
    loading) is named: 'TTFT 33.10 s (waited 31.2 s for the engine, then 1.90 s)'."""
    parts = [f"via {metrics['served_by']}"] if metrics.get("served_by") else []
    if metrics.get("ttft_s") is not None:
        ttft, waited = metrics["ttft_s"], metrics.get("waited_s") or 0.0
        if waited >= WAIT_SHOWN_S:
            then = ttft - waited
            parts.append(
                f"TTFT {ttft:.2f} s (waited {waited:.1f} s for the engine, then {then:.2f} s)"
            )
        else:
            parts.append(f"TTFT {ttft:.2f} s")
    if metrics.get("tokens_per_s") is not None:
        over = f" (all {samples} samples)" if samples > 1 else ""
        parts.append(f"{metrics['tokens_per_s']:.1f} tok/s{over}")
    if "prompt_tokens" in metrics:
        parts.append(
            f"prompt {metrics['prompt_tokens']} tok ({metrics.get('cached_tokens', 0)} cached)"
        )
    per_sample = metrics.get("sample_tokens") or []
    if samples > 1 and 0 <= selected < len(per_sample):
        parts.append(f"{per_sample[selected]} tok")
    elif "generated_tokens" in metrics:
        # A reply stored before per-sample counts were kept: only the total is known.
        over = f" over {samples} samples" if samples > 1 else ""
        parts.append(f"{metrics['generated_tokens']} tok{over}")
    if metrics.get("dropped_turns"):
        parts.append(f"{metrics['dropped_turns']} oldest turn(s) left out to fit")
    reasons = metrics.get("finish_reasons") or []
    finish = reasons[selected] if 0 <= selected < len(reasons) else metrics.get("finish_reason")
    if finish == "length":
        parts.append("hit max tokens")
    return " · ".join(parts)


class MessageBubble(QFrame):
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal()
    alternative_selected = Signal(int, int)  # message id (-1 while streaming), index

    def __init__(self, role: str, message_id: int | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.message_id = message_id
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.who = _label("bubbleRole", "You" if role == "user" else "Assistant")
        self.status = _label("bubbleStatus")
        self.prev_alt = _tool_button("‹", "altButton")
        self.alt_label = _label("altLabel")
        self.next_alt = _tool_button("›", "altButton")
        self.copy = _tool_button("Copy", "bubbleAction")
        self.edit = _tool_button("Edit", "bubbleAction")
        self.regenerate = _tool_button("Regenerate", "bubbleAction")
        self.body = MarkdownView()
        self.metrics = _label("bubbleMetrics")
        self.metrics.setWordWrap(True)
        # Who and the status on the left, the actions on the right; past the bubble's width
        # the actions wrap onto a second line rather than widening it (header_flow.py).
        self.header = header = HeaderFlow(spacing=6)
        for lead in (self.who, self.status):
            header.add_lead(lead)
        for trail in (self.prev_alt, self.alt_label, self.next_alt, self.copy, self.edit):
            header.add_trail(trail)
        header.add_trail(self.regenerate)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.body)
        layout.addWidget(self.metrics)
        self._alternatives: list[str] = []
        self._selected = 0
        self._json_view = False
        self._content: tuple | None = None  # set_content's arguments, to draw again
        self._written = ""  # the text shown, as the model wrote it (what Copy copies)
        self.edit.setVisible(role == "user" and message_id is not None)
        self.regenerate.setVisible(False)
        self.copy.clicked.connect(self._copy)
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
        self._content = (text, status, alternatives, selected, metrics)
        self._alternatives = list(alternatives or [])
        self._selected = selected
        shown = self._alternatives[selected] if self._alternatives else text
        self._written = shown
        # Not while streaming: a reply is JSON only once it is whole, and redrawing it indented
        # at every pause would jump.
        formatted = self._json_view and self.role == "assistant" and status != "generating"
        drawn = json_markdown(shown) if formatted else None
        self.body.set_markdown(drawn or shown or ("…" if status == "generating" else ""))
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
        samples = max(1, len(self._alternatives))
        self.metrics.setText(format_metrics(metrics or {}, selected, samples))
        self.metrics.setVisible(bool(metrics))

    def set_json_view(self, on: bool) -> None:
        """Draw a reply that is JSON indented in a code block (on) or as written (off)."""
        if on != self._json_view:
            self._json_view = on
            if self._content is not None:
                self.set_content(*self._content)

    def set_editable(self, on: bool) -> None:
        self.edit.setEnabled(on)

    def set_regenerable(self, on: bool) -> None:
        self.regenerate.setVisible(on)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self._written or self.body.markdown())

    def _step_alternative(self, delta: int) -> None:
        index = self._selected + delta
        if 0 <= index < len(self._alternatives):
            mid = self.message_id if self.message_id is not None else -1
            self.alternative_selected.emit(mid, index)


def _label(name: str, text: str = "") -> QLabel:
    label = QLabel(text)
    label.setObjectName(name)
    return label


def _tool_button(text: str, name: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setObjectName(name)
    return button
