"""Reading JSON that is still being written: where a value ends (None while it is open) and the
text of a string so far. Tool calls stream while the model writes them; these let the server
send a call's name as soon as it is complete and its arguments as they grow."""

from __future__ import annotations

import json

_WHITESPACE = " \t\r\n"


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at `start`, or None while it is open.
    Only strings and brackets are tracked: the grammar has already made it valid JSON."""
    i = skip_space(text, start)
    if i >= len(text):
        return None
    if text[i] == '"':
        return string_end(text, i)
    if text[i] not in "{[":
        # A number, true, false or null ends where the next separator starts.
        j = i
        while j < len(text) and text[j] not in ",}] \t\r\n":
            j += 1
        return j if j < len(text) else None
    depth = 0
    j = i
    while j < len(text):
        c = text[j]
        if c == '"':
            end = string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def string_end(text: str, start: int) -> int | None:
    """Past the closing quote of the string that opens at text[start], or None while open."""
    j = start + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j + 1
        j += 1
    return None


def partial_string(text: str, start: int) -> tuple[str, bool]:
    """The decoded text of the string opening at text[start] so far, and whether it is closed.
    An escape cut in half is held back until its next token."""
    end = string_end(text, start)
    raw = text[start + 1 : (end - 1) if end is not None else len(text)]
    while raw:
        try:
            return json.loads(f'"{raw}"'), end is not None
        except ValueError:
            raw = raw[:-1]  # a trailing "\" or "\u00" waits for the rest
    return "", end is not None


def expect(text: str, i: int, literal: str) -> int | None:
    """Past `literal` at i (whitespace before it skipped); None if the text is not there yet
    or says something else."""
    i = skip_space(text, i)
    return i + len(literal) if text.startswith(literal, i) else None
