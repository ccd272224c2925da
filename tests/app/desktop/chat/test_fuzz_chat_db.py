"""The chats database's reader under the fuzz harness (tests/fuzz_readers.py): the window opens
it at start (app/desktop/chat/recovery.py moves a damaged file aside and salvages what it can)
and lists every conversation and its messages. Nothing may escape: no caller catches, so any
exception would keep the app from starting or a chat from showing."""

from __future__ import annotations

from pathlib import Path

from fuzz_readers import Reader, check_bounded, check_corpus, fuzz, hostile_paths

from kvscope.app.desktop.chat.recovery import open_chat_store


def read_chats(path: Path) -> None:
    """Open, list, search, read every chat; what comes back is of the types the views use."""
    store, problem = open_chat_store(path)
    assert problem is None or isinstance(problem, str)
    try:
        store.conversations("a")
        for c in store.conversations():
            assert all(isinstance(v, str) for v in (c.title, c.system_prompt)), c
            assert isinstance(c.updated_at, float) and (
                c.sampling is None or type(c.sampling) is dict
            )
            for m in store.messages(c.id):
                assert isinstance(m.content, str) and m.role in ("user", "assistant"), m
                assert all(isinstance(a, str) for a in m.alternatives), m
                assert not m.alternatives or 0 <= m.selected < len(m.alternatives), m
                assert type(m.metrics) is dict, m
    finally:
        store.close()


CHATS = Reader("chat_db", read_chats, (), ".sqlite3")


def test_the_corpus_reads_within_bounds(tmp_path):
    peaks = check_corpus(CHATS, tmp_path)
    assert len(peaks) >= 8


def test_mutated_databases_open_and_list(tmp_path):
    fuzz(CHATS, tmp_path, examples=200)


def test_a_gigabyte_of_nul_bytes_is_moved_aside_unread(tmp_path):
    path = hostile_paths(tmp_path, ".sqlite3", special=False)["nul"]
    _, peak = check_bounded(CHATS, path)
    assert peak < 16 << 20, peak
    assert [p.name for p in tmp_path.glob("nul.sqlite3.damaged-*")]
