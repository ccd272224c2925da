"""The chat list never re-sorts under the pointer: a click lands on the chat it was aimed at."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication

from kvscope.app.desktop.chat.conversation_list import GENERATING_MARK, ConversationList
from kvscope.app.desktop.chat.store import ChatStore


def _titles(listing: ConversationList) -> list[str]:
    return [listing.list.item(row).toolTip() for row in range(listing.list.count())]


def test_a_reply_reorders_the_list_only_once_the_pointer_leaves(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    older = store.create_conversation("older").id
    time.sleep(0.01)
    store.create_conversation("newer")
    listing = ConversationList(store)
    qtbot.addWidget(listing)
    listing.refresh()
    assert _titles(listing) == ["newer", "older"]
    QApplication.sendEvent(listing.list, QEvent(QEvent.Type.Enter))
    store.add_message(older, "user", "hi")  # its reply starts: the chat becomes the newest
    listing.set_generating(older, True)
    assert _titles(listing) == ["newer", "older"]  # the rows stay where the pointer aims
    marked = listing.list.item(1)
    assert marked.text().startswith(GENERATING_MARK)
    assert marked.data(Qt.ItemDataRole.UserRole) == older
    QApplication.sendEvent(listing.list, QEvent(QEvent.Type.Leave))
    assert _titles(listing) == ["older", "newer"]  # newest first again
    listing.set_generating(older, False)  # the pointer is away: at once
    assert not listing.list.item(0).text().startswith(GENERATING_MARK)
    store.close()
