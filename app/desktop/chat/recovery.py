"""Opening the chat database when the file is damaged: move it aside, salvage, start.

A chats file that SQLite cannot read (a disk error, a crash of another tool, a file that is
not a database at all) must not keep the app from starting. It is renamed beside itself
(`chats.sqlite3.damaged-YYYYmmdd-HHMMSS`, never deleted), a fresh database takes its place,
and every conversation and message that can still be read from the old file, row by row, is
copied over. The window then says what happened and where the old file is.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from kvscope.app.desktop.chat.store import ChatStore, NewerSchemaError

TABLES = ("conversations", "messages")  # parents first: messages reference conversations
# What reading a damaged file raises: SQLite's errors, and its messages quoting bytes that are
# not UTF-8 (a schema's damaged name), which Python cannot decode.
READ_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def open_chat_store(path: Path) -> tuple[ChatStore, str | None]:
    """The store at `path`, and None; or, for a damaged file, a fresh store with what could be
    salvaged, and a message for the user."""
    path = Path(path)
    try:
        store = ChatStore(path)
        # integrity_check, not quick_check: an index that lost a row passes the quick one and
        # fails the first query through it ("database disk image is malformed"), mid-session.
        # The full check reads every index too, at little more cost than the quick one.
        verdict = store._db.execute("PRAGMA integrity_check(1)").fetchone()[0]
        if verdict == "ok":
            verdict = _schema_check(store)
        if verdict == "ok":
            return store, None
        store.close()
        reason = f"integrity check: {verdict}"
    except NewerSchemaError as e:  # a newer KVScope's chats: kept as they are, unread
        return ChatStore(":memory:"), (
            f"{e}. Chats in this session will not be saved; update KVScope to open them."
        )
    except UnicodeDecodeError as e:  # SQLite's message quotes a damaged schema's bytes
        reason = f"its schema is not UTF-8 text ({e.reason} at byte {e.start})"
    except (sqlite3.DatabaseError, OSError) as e:
        if not _damaged(e) or not path.is_file():
            # Not the file's content but the place (a read-only or missing data dir): chats live
            # in memory for this session, and the user is told they will not be kept.
            return ChatStore(":memory:"), (
                f"The chats database {path} cannot be opened ({e}). Chats in this session "
                "will not be saved; set KVSCOPE_DATA_DIR to a writable folder to keep them."
            )
        reason = str(e)
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    path.replace(aside)
    for suffix in ("-wal", "-shm"):  # SQLite's side files belong with the old database
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(aside.with_name(aside.name + suffix))
    store = ChatStore(path)
    counts = salvage(aside, store)
    saved = ", ".join(f"{n} {table}" for table, n in counts.items())
    return store, (
        f"The chats database could not be read ({reason}). It was moved to {aside} and a new "
        f"one started; recovered from the old file: {saved or 'nothing'}."
    )


def _schema_check(store: ChatStore) -> str:
    """Which table lacks which columns, or "ok": a damaged schema (a flipped byte in a
    column's name) passes SQLite's check but fails every later read of that column."""
    fresh = ChatStore(":memory:")
    try:
        for table in TABLES:
            want = {row[1] for row in fresh._db.execute(f"PRAGMA table_info({table})")}
            have = {row[1] for row in store._db.execute(f"PRAGMA table_info({table})")}
            if want - have:
                return f"table {table} lacks the columns {sorted(want - have)}"
    finally:
        fresh.close()
    return "ok"


def _damaged(error: Exception) -> bool:
    """SQLite's words for a file whose content is broken (not for one it cannot open)."""
    text = str(error).lower()
    return isinstance(error, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    )


def salvage(old: Path, store: ChatStore) -> dict[str, int]:
    """Copy every readable row of the known tables from `old` into `store`."""
    counts: dict[str, int] = {}
    try:
        src = sqlite3.connect(f"file:{old}?mode=ro", uri=True)
    except READ_ERRORS:
        return counts
    src.text_factory = lambda raw: raw.decode("utf-8", errors="replace")  # as the store reads
    try:
        for table in TABLES:
            counts[table] = _copy_table(src, store._db, table)
    finally:
        src.close()
    return counts


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> int:
    try:
        columns = [row[1] for row in src.execute(f"PRAGMA table_info({table})")]
        known = {row[1] for row in dst.execute(f"PRAGMA table_info({table})")}
        columns = [c for c in columns if c in known]
        if not columns:
            return 0
        cursor = src.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid")
    except READ_ERRORS:
        return 0
    insert = (
        f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' * len(columns))})"
    )
    copied = 0
    while True:
        try:
            row = cursor.fetchone()
        except READ_ERRORS:  # the rest of the table is unreadable
            break
        if row is None:
            break
        try:
            copied += dst.execute(insert, row).rowcount
        except READ_ERRORS:  # a row that breaks a constraint: skip it, keep the rest
            continue
    return copied
