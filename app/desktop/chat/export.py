"""Chat export: a chat as it is stored, to a Markdown file to read or a JSON file to process.

Export only reads the store. Markdown gives a heading per chat, the system prompt, and each
message under its role (every sample of an n > 1 reply, the one shown first). JSON is a versioned
object holding every stored field of the chats and their messages (metrics, alternatives,
status, times), so nothing the store knows is lost on the way out.

The save dialog starts in the folder of the last export (remembered in the data folder), or
in the user's Documents the first time, never in whatever folder the app was started from.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from PySide6.QtCore import QStandardPaths

from kvscope.app.core import paths
from kvscope.app.desktop.chat.store import ChatStore, Conversation, Message

EXPORT_VERSION = 1
FORMATS = {"markdown": ".md", "json": ".json"}
ROLE_LABELS = {"user": "You", "assistant": "Assistant"}
LAST_FOLDER_FILE = "last_export_folder.txt"

log = logging.getLogger(__name__)


def chat_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """One chat as a Markdown document."""
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", ""]
        lines += [f"> {line}" if line else ">" for line in conversation.system_prompt.split("\n")]
        lines.append("")
    for message in messages:
        for heading, text in _sections(message):
            lines += [f"## {heading}", "", text, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _sections(message: Message) -> list[tuple[str, str]]:
    label = ROLE_LABELS[message.role]
    status = "" if message.status == "complete" else f" ({message.status})"
    if len(message.alternatives) < 2:
        return [(label + status, message.content)]
    count = len(message.alternatives)
    order = [message.selected] + [i for i in range(count) if i != message.selected]
    sections = []
    for i in order:
        shown = " (shown)" if i == message.selected else ""
        sections.append(
            (f"{label}{status}, sample {i + 1} of {count}{shown}", message.alternatives[i])
        )
    return sections


def chats_json(chats: list[tuple[Conversation, list[Message]]]) -> dict:
    """Chats and their messages, every stored field, under a format version."""
    return {
        "kvscope_chat_export": EXPORT_VERSION,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "conversations": [
            {**dataclasses.asdict(conv), "messages": [dataclasses.asdict(m) for m in messages]}
            for conv, messages in chats
        ],
    }


def export_chat(store: ChatStore, conversation_id: int, path: str | Path, fmt: str) -> Path:
    """Write one chat to `path` as "markdown" or "json"; returns the path written."""
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r} is not one of {sorted(FORMATS)}")
    conversation = store.conversation(conversation_id)
    messages = store.messages(conversation_id)
    if fmt == "markdown":
        text = chat_markdown(conversation, messages)
    else:
        text = json.dumps(chats_json([(conversation, messages)]), ensure_ascii=False, indent=2)
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path


def suggested_file_name(title: str, fmt: str) -> str:
    """A file name from a chat title: letters, digits, dashes and underscores only."""
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in title.strip())
    stem = "-".join(part for part in stem.split("-") if part)[:60] or "chat"
    return stem + FORMATS[fmt]


def export_folder() -> Path:
    """Where the save dialog starts: the last export's folder while it exists, else Documents
    (QStandardPaths: ~/Documents, the localised name, or the home folder where there is none)."""
    try:
        remembered = (paths.data_dir() / LAST_FOLDER_FILE).read_text(encoding="utf-8").strip()
    except OSError:  # none yet, or unreadable: the default below
        remembered = ""
    if remembered and Path(remembered).is_dir():
        return Path(remembered)
    location = QStandardPaths.StandardLocation.DocumentsLocation
    documents = QStandardPaths.writableLocation(location)
    return Path(documents) if documents and Path(documents).is_dir() else Path.home()


def remember_export_folder(written: str | Path) -> None:
    """The next export starts in the folder of `written`; a failure to save that only costs
    the convenience, so it is not raised."""
    try:
        (paths.data_dir() / LAST_FOLDER_FILE).write_text(
            str(Path(written).resolve().parent), encoding="utf-8"
        )
    except OSError as e:
        log.warning("could not remember the export folder: %s", e)
