"""The main window's first size and its columns' first widths.

On the screens people have (1024x700 laptops to 1400x860 and up), so that the window fits the
screen's free area and the chat column is wide enough to read on the narrowest of them.
"""

from __future__ import annotations

from PySide6.QtCore import QRect

DEFAULT_SIZE = (1400, 860)
CONVERSATION_LIST_WIDTH = 190
NARROW_WINDOW = 1200  # below this the first layout favours the chat column
CHAT_COMFORT_WIDTH = 400
CHAT_SHARE = 0.37  # of what the list leaves; the map takes the rest


def initial_size(available: QRect) -> tuple[int, int]:
    """1400x860, or the screen's free area where that is smaller: without a window manager (or
    with one that keeps the requested size) a 1024x700 screen would cut the window off."""
    return min(DEFAULT_SIZE[0], available.width()), min(DEFAULT_SIZE[1], available.height())


def first_sizes(width: int, list_minimum: int, map_minimum: int) -> list[int]:
    """The splitter's [list, chat, map] widths: CHAT_SHARE of the room to the chat, the rest to
    the map; on a narrow window the list gives up its spare width and the chat takes what the
    map's minimum leaves, up to CHAT_COMFORT_WIDTH (at 1024 px the chat got 282 px before, its
    title elided to "Na…")."""
    listed = list_minimum if width < NARROW_WINDOW else CONVERSATION_LIST_WIDTH
    rest = width - listed
    chat = max(int(rest * CHAT_SHARE), min(CHAT_COMFORT_WIDTH, rest - map_minimum))
    return [listed, chat, rest - chat]
