"""ChatStore: conversations and messages in SQLite, committed one message at a time.

Every write is its own transaction, so a crash mid-generation loses at most the reply in flight
(which is only written when it finishes or is stopped), never the history. WAL mode keeps a
reader (a second window, a test) from blocking the writer. The schema version lives in
PRAGMA user_version; `_MIGRATIONS[i]` upgrades version i to i + 1.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.app.desktop.chat import alternatives as reply_alternatives

_MIGRATIONS = [
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'complete',
        alternatives TEXT,
        selected INTEGER NOT NULL DEFAULT 0,
        metrics TEXT,
        created_at REAL NOT NULL,
        UNIQUE (conversation_id, position)
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
    """,
    # Each chat's own sampling settings as JSON; NULL (chats from before): the app's defaults.
    "ALTER TABLE conversations ADD COLUMN sampling TEXT",
    # The model a chat runs on when not this engine: a connection's label and a model it
    # serves. NULL (chats from before, and local chats): the embedded engine.
    "ALTER TABLE conversations ADD COLUMN remote_connection TEXT;"
    "ALTER TABLE conversations ADD COLUMN remote_model TEXT",
    # Each alternative's own figures and status (app/desktop/chat/alternatives.py): Regenerate
    # keeps the old reply as one. NULL (replies from before): the message's metrics.
    "ALTER TABLE messages ADD COLUMN alternative_metrics TEXT",
]
SCHEMA_VERSION = len(_MIGRATIONS)
STATUSES = ("complete", "stopped", "error")


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created_at: float
    updated_at: float
    sampling: dict | None = None  # its own SamplingSettings fields; None: the app's defaults
    remote_connection: str | None = None  # a connection's label; None: this engine
    remote_model: str | None = None

    @property
    def remote(self) -> RemoteTarget | None:
        """The connection's model the chat runs on; None: the embedded engine."""
        if self.remote_connection and self.remote_model:
            return RemoteTarget(self.remote_connection, self.remote_model)
        return None


@dataclass(frozen=True)
class RemoteTarget:
    """A model on a connection, by the connection's label (no URL or key is stored with
    chats: the connection may be made again, with another key, and the chat still finds it)."""

    connection: str
    model: str

    @property
    def label(self) -> str:
        return f"{self.connection} · {self.model}"


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    position: int
    role: str  # "user" | "assistant"
    content: str  # the selected alternative for an n > 1 reply
    status: str = "complete"  # "complete" | "stopped" (partial reply kept) | "error"
    alternatives: list[str] = field(default_factory=list)  # all n samples; [] when n == 1
    selected: int = 0
    metrics: dict = field(default_factory=dict)  # ttft_s, tokens_per_s, prompt/cached tokens...
    created_at: float = 0.0
    alternative_metrics: list[dict] = field(default_factory=list)  # one per alternative, or []


class NewerSchemaError(ValueError):
    """The database was written by a newer KVScope: left as it is, never migrated down."""


class ChatStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; writes open explicit transactions through _tx().
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        # A damaged file can hold text that is not UTF-8: shown with U+FFFD, never an exception.
        self._db.text_factory = _text
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(
                f"{self.path} has chat schema version {version}; this KVScope knows up to "
                f"{SCHEMA_VERSION} (a newer KVScope wrote it)"
            )
        for step in range(version, SCHEMA_VERSION):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {step + 1}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def _touch(self, conversation_id: int, now: float | None = None) -> None:
        """The chat was active now (the list sorts by it); inside a transaction."""
        self._db.execute(
            "UPDATE conversations SET updated_at = ? WHERE id = ?",
            (time.time() if now is None else now, conversation_id),
        )

    # ---- conversations -------------------------------------------------------------------
    def create_conversation(
        self,
        title: str = "New chat",
        system_prompt: str = "",
        sampling: dict | None = None,
        remote: RemoteTarget | None = None,
    ) -> Conversation:
        now = time.time()
        where = (remote.connection, remote.model) if remote else (None, None)
        with self._tx():
            cur = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, created_at, updated_at, "
                "sampling, remote_connection, remote_model) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (title, system_prompt, now, now, _json_or_null(sampling), *where),
            )
        assert cur.lastrowid is not None  # the INSERT above sets it
        return self.conversation(cur.lastrowid)

    def conversation(self, conversation_id: int) -> Conversation:
        row = self._db.execute(
            "SELECT * FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"conversation {conversation_id} does not exist")
        return _conversation(row)

    def conversations(self, search: str = "") -> list[Conversation]:
        """Most recently active first; `search` matches titles and message text, any case."""
        if not search.strip():
            rows = self._db.execute(
                "SELECT * FROM conversations ORDER BY updated_at DESC, id DESC"
            ).fetchall()
        else:
            pattern = "%" + _escape_like(search.strip()) + "%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' "
                "OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
                "AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated_at DESC, id DESC",
                (pattern,),
            ).fetchall()
        return [_conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        title = title.strip()
        if not title:
            raise ValueError("a conversation title cannot be empty")
        self._update_conversation(conversation_id, "title", title)

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._update_conversation(conversation_id, "system_prompt", system_prompt)

    def set_sampling(self, conversation_id: int, sampling: dict) -> None:
        """Keep a chat's sampling settings; not an activity, so the chat keeps its place."""
        with self._tx():
            cur = self._db.execute(
                "UPDATE conversations SET sampling = ? WHERE id = ?",
                (_json_or_null(sampling), conversation_id),
            )
        if cur.rowcount == 0:
            raise KeyError(f"conversation {conversation_id} does not exist")

    def set_remote(self, conversation_id: int, target: RemoteTarget | None) -> None:
        """Run the chat on a connection's model (None: this engine); keeps the chat's place."""
        values = (target.connection, target.model) if target else (None, None)
        with self._tx():
            cur = self._db.execute(
                "UPDATE conversations SET remote_connection = ?, remote_model = ? WHERE id = ?",
                (*values, conversation_id),
            )
        if cur.rowcount == 0:
            raise KeyError(f"conversation {conversation_id} does not exist")

    def _update_conversation(self, conversation_id: int, column: str, value: str) -> None:
        with self._tx():
            cur = self._db.execute(
                f"UPDATE conversations SET {column} = ?, updated_at = ? WHERE id = ?",
                (value, time.time(), conversation_id),
            )
        if cur.rowcount == 0:
            raise KeyError(f"conversation {conversation_id} does not exist")

    def delete_conversation(self, conversation_id: int) -> None:
        with self._tx():
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---- messages ------------------------------------------------------------------------
    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        status: str = "complete",
        alternatives: list[str] | None = None,
        selected: int = 0,
        metrics: dict | None = None,
    ) -> Message:
        """Append a message and commit it before returning."""
        if role not in ("user", "assistant"):
            raise ValueError(f"message role {role!r} is not 'user' or 'assistant'")
        if status not in STATUSES:
            raise ValueError(f"message status {status!r} is not one of {STATUSES}")
        now = time.time()
        with self._tx():
            position = self._db.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()[0]
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, position, role, content, status, "
                "alternatives, selected, metrics, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    position,
                    role,
                    content,
                    status,
                    json.dumps(alternatives) if alternatives else None,
                    selected,
                    json.dumps(metrics) if metrics else None,
                    now,
                ),
            )
            self._touch(conversation_id, now)
        assert cur.lastrowid is not None  # the INSERT above sets it
        return self.message(cur.lastrowid)

    def message(self, message_id: int) -> Message:
        row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"message {message_id} does not exist")
        return _message(row)

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position", (conversation_id,)
        ).fetchall()
        return [_message(r) for r in rows]

    def select_alternative(self, message_id: int, index: int) -> Message:
        """Make sample `index` of an n > 1 reply the one later turns see."""
        msg = self.message(message_id)
        if not 0 <= index < len(msg.alternatives):
            raise ValueError(
                f"alternative {index} out of range: the reply has {len(msg.alternatives)}"
            )
        entries = msg.alternative_metrics
        metrics = reply_alternatives.merged(entries, index) if entries else msg.metrics
        status = reply_alternatives.status_of(entries, index, msg.status)
        with self._tx():
            self._db.execute(
                "UPDATE messages SET selected = ?, content = ?, metrics = ?, status = ? "
                "WHERE id = ?",
                (index, msg.alternatives[index], json.dumps(metrics) or None, status, message_id),
            )
        return self.message(message_id)

    def add_alternatives(
        self, message_id: int, texts: list[str], metrics: dict | None, status: str, shown: int = 0
    ) -> Message:
        """Regenerate's new reply (its n texts) joins the old reply's alternatives; its sample
        `shown` is the one shown."""
        msg = self.message(message_id)
        if msg.role != "assistant" or not texts or status not in STATUSES:
            raise ValueError(f"cannot add {len(texts)} {status!r} alternatives to {msg.role}")
        kept, entries = reply_alternatives.kept_entries(
            msg.alternatives, msg.content, msg.metrics, msg.status, msg.alternative_metrics
        )
        alternatives = kept + list(texts)
        entries += reply_alternatives.entries_of(list(texts), metrics, status)
        selected = len(kept) + min(max(shown, 0), len(texts) - 1)
        with self._tx():
            self._db.execute(
                "UPDATE messages SET content = ?, status = ?, alternatives = ?, selected = ?, "
                "metrics = ?, alternative_metrics = ? WHERE id = ?",
                (
                    alternatives[selected],
                    status,
                    json.dumps(alternatives),
                    selected,
                    json.dumps(reply_alternatives.merged(entries, selected)),
                    json.dumps(entries),
                    message_id,
                ),
            )
            self._touch(msg.conversation_id)
        return self.message(message_id)

    def truncate_from(self, message_id: int) -> None:
        """Delete a message and every later one in its conversation (edit, regenerate)."""
        msg = self.message(message_id)
        with self._tx():
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?",
                (msg.conversation_id, msg.position),
            )
            self._touch(msg.conversation_id)

    def edit_and_truncate(self, message_id: int, content: str) -> Message:
        """Replace a user message's text and drop everything after it, in one transaction."""
        msg = self.message(message_id)
        if msg.role != "user":
            raise ValueError(f"message {message_id} is an {msg.role} message; only user messages")
        with self._tx():
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position > ?",
                (msg.conversation_id, msg.position),
            )
            self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))
            self._touch(msg.conversation_id)
        return self.message(message_id)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


# A row read back as the dataclasses type it, whatever a damaged or hand-edited file holds
# (SQLite keeps any value in any column): a wrong type reads as the field's empty value.
def _conversation(row: sqlite3.Row) -> Conversation:
    d = dict(row)
    return Conversation(
        id=_int(d["id"]),
        title=_str(d["title"]),
        system_prompt=_str(d["system_prompt"]),
        created_at=_float(d["created_at"]),
        updated_at=_float(d["updated_at"]),
        sampling=_sampling_from(d.get("sampling")),
        remote_connection=_str(d.get("remote_connection")) or None,
        remote_model=_str(d.get("remote_model")) or None,
    )


def _sampling_from(text: object) -> dict | None:
    """A chat's saved sampling settings; unreadable ones (a salvaged row) read as the defaults."""
    value = _json(text, None)
    return value if isinstance(value, dict) else None


def _json_or_null(value: dict | None) -> str | None:
    return json.dumps(value) if value is not None else None


def _message(row: sqlite3.Row) -> Message:
    d = dict(row)
    alternatives = _json(d["alternatives"], [])
    if not isinstance(alternatives, list) or not all(isinstance(a, str) for a in alternatives):
        alternatives = []
    metrics = _json(d["metrics"], {})
    entries = _json(d.get("alternative_metrics"), [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        entries = []
    selected = _int(d["selected"])
    return Message(
        id=_int(d["id"]),
        conversation_id=_int(d["conversation_id"]),
        position=_int(d["position"]),
        role=d["role"] if d["role"] in ("user", "assistant") else "assistant",
        content=_str(d["content"]),
        status=d["status"] if d["status"] in STATUSES else "complete",
        alternatives=alternatives,
        selected=selected if 0 <= selected < len(alternatives) else 0,
        metrics=metrics if isinstance(metrics, dict) else {},
        created_at=_float(d["created_at"]),
        alternative_metrics=entries if len(entries) == len(alternatives) else [],
    )


def _json(text: object, default: object) -> object:
    if not isinstance(text, str) or not text:
        return default
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # a damaged or salvaged row: its default
        return default


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _float(value: object) -> float:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return 0.0


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def default_store_path() -> Path:
    from kvscope.app.core.paths import data_dir

    return data_dir() / "chats.sqlite3"
