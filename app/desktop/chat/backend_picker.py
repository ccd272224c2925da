"""BackendPicker: which model a chat runs on, "This engine" or a connection's "label · model".

A compact combo box beside the composer's context meter, shown once there is a connection (or
the chat on show runs on one). The entries come from RemoteModels (/v1/models of each
connection, listed off the GUI thread); a connection still being listed or unreachable shows as
one disabled entry saying so. A chat bound to a connection that is gone keeps its choice, shown
as "… (not connected)", so nothing is lost until the user picks another.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QSizePolicy,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QWidget,
)

from kvscope.app.desktop.chat.store import RemoteTarget
from kvscope.app.remote.remote_models_qt import ConnectionModels

THIS_ENGINE = "This engine"
MAX_WIDTH = 230  # the chat column is ~300 px at 1024 wide: leave room for the context meter


class BackendPicker(QComboBox):
    target_chosen = Signal(object)  # RemoteTarget, or None for this engine; user choices only
    opening = Signal()  # the list is about to drop down (a chance to list models again)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("backendPicker")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(10)
        self.setMaximumWidth(MAX_WIDTH)
        # Takes the row's free width up to MAX_WIDTH: "label · model" names are long.
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Which model this chat runs on: this engine, or a connected server's")
        self._entries: list[ConnectionModels] = []
        self._current: RemoteTarget | None = None
        self.activated.connect(self._activated)
        self._rebuild()

    def set_entries(self, entries: list[ConnectionModels]) -> None:
        """RemoteModels.entries(): each connection's state and models."""
        self._entries = list(entries)
        self._rebuild()

    def set_current(self, target: RemoteTarget | None) -> None:
        """Show the chat's own choice (does not emit target_chosen)."""
        self._current = target
        self._rebuild()

    def current_target(self) -> RemoteTarget | None:
        return self._current

    def offers(self, target: RemoteTarget) -> bool:
        """Whether a connection lists this model now."""
        return any(
            e.label == target.connection and e.state == "ok" and target.model in e.models
            for e in self._entries
        )

    def showPopup(self) -> None:  # noqa: N802 (Qt's name)
        self.opening.emit()
        super().showPopup()

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        # Elided in the middle, not cut off: both the server and the model's tail stay legible.
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        field = self.style().subControlRect(
            QStyle.ComplexControl.CC_ComboBox, option, QStyle.SubControl.SC_ComboBoxEditField, self
        )
        option.currentText = self.fontMetrics().elidedText(
            option.currentText, Qt.TextElideMode.ElideMiddle, field.width()
        )
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)

    # ---- internals -----------------------------------------------------------------------
    def _rebuild(self) -> None:
        self.blockSignals(True)
        self.clear()
        self.addItem(THIS_ENGINE, None)
        self.setItemData(0, "The model loaded in this window", Qt.ItemDataRole.ToolTipRole)
        for entry in self._entries:
            if entry.state == "ok" and entry.models:
                for model in entry.models:
                    target = RemoteTarget(entry.label, model)
                    self.addItem(target.label, target)
                    self.setItemData(
                        self.count() - 1,
                        f"{model} on {entry.connection.url}",
                        Qt.ItemDataRole.ToolTipRole,
                    )
                continue
            text = {
                "listing": f"{entry.label} · listing models…",
                "ok": f"{entry.label} · serves no models",
            }.get(entry.state, f"{entry.label} · unreachable")
            self._add_disabled(text, entry.error or text)
        current = self._current
        index = self._index_of(current)
        if current is not None and index < 0:  # the chat's connection or model is not offered
            self.addItem(f"{current.label} ({self._why_not_offered(current)})", current)
            index = self.count() - 1
            self.setItemData(
                index,
                "This chat runs on a connection that is not connected now (Engine ▸ Connect…), "
                "is unreachable, or no longer lists this model. Its history is kept; pick "
                "another model to go on here.",
                Qt.ItemDataRole.ToolTipRole,
            )
        self.setCurrentIndex(index)
        self.setToolTip(f"This chat runs on: {self.itemText(index)}")  # cut off when narrow
        self.blockSignals(False)
        self.setVisible(bool(self._entries) or self._current is not None)

    def _why_not_offered(self, target: RemoteTarget) -> str:
        entry = next((e for e in self._entries if e.label == target.connection), None)
        if entry is None:
            return "not connected"
        return {"listing": "listing…", "error": "unreachable"}.get(entry.state, "not listed")

    def _index_of(self, target: RemoteTarget | None) -> int:
        if target is None:
            return 0
        # By value: findData compares the wrapped Python objects by identity.
        return next((i for i in range(self.count()) if self.itemData(i) == target), -1)

    def _add_disabled(self, text: str, tooltip: str) -> None:
        self.addItem(text, "disabled")
        index = self.count() - 1
        self.setItemData(index, tooltip, Qt.ItemDataRole.ToolTipRole)
        model = self.model()
        if isinstance(model, QStandardItemModel):
            model.item(index).setEnabled(False)

    def _activated(self, index: int) -> None:
        data = self.itemData(index)
        if data == "disabled":
            self._rebuild()  # back to the chat's own choice
            return
        if data != self._current:
            self._current = data
            self.target_chosen.emit(data)
