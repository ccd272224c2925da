"""What the hover card says about one physical block (rich text for a QLabel), in the colours of
the theme on show (app/desktop/palette.py): the card is drawn again on every hover."""

from __future__ import annotations

from html import escape

from kvscope.app.core.request_ids import LOAD_PREFIX, conversation_of_group, group_of
from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.kv_groups import group_name, has_windows
from kvscope.app.desktop.palette import current
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot

MAX_TEXT_CHARS = 240
# Looked up by the plain int a snapshot's state array holds (a BlockState hashes as its value).
STATE_NAMES: dict[int, str] = {
    BlockState.FREE: "free",
    BlockState.USED: "in use",
    BlockState.CACHED: "cached (free, holds a reusable prefix)",
    BlockState.RESERVED: "reserved (no tokens written yet)",
}


def block_owners(snapshot: KVSnapshot, block: int) -> list[tuple[str, int, int]]:
    """(request id, seq id, logical index) of every sequence whose table or reservation holds
    the block; a per-sequence scan, done only for the hovered block."""
    owners = []
    for s in snapshot.sequences:
        if block in s.block_table:
            # With KV groups block_table lists every group's blocks; the logical index is the
            # one in the block's own group table.
            tables = s.group_tables or (s.block_table,)
            index = next(t.index(block) for t in tables if block in t)
            owners.append((s.request_id, s.seq_id, index))
        elif block in s.reserved_blocks:
            owners.append((s.request_id, s.seq_id, s.reserved_blocks.index(block)))
    return owners


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def sharers(request_ids: list[str]) -> str:
    """Who shares a block, by request group: "3 chats", "2 chats, 1 simulated user"."""
    groups = {group_of(r) for r in request_ids}
    chats = sum(conversation_of_group(g) is not None for g in groups)
    users = sum(g.startswith(LOAD_PREFIX) for g in groups)
    parts = [_plural(chats, "chat")] if chats else []
    parts += [_plural(users, "simulated user")] if users else []
    if len(groups) - chats - users:
        parts.append(_plural(len(groups) - chats - users, "other request"))
    return ", ".join(parts)


def _shown_text(text: str) -> str:
    """Token text as it should read in one card: whitespace made visible, long text cut."""
    if len(text) > MAX_TEXT_CHARS:
        text = text[: MAX_TEXT_CHARS - 1] + "…"
    shown = escape(text).replace("\n", f"<span style='color:{current().faint}'>⏎</span>")
    return shown.replace("\t", "→").replace("  ", " &nbsp;")


def describe_block(
    snapshot: KVSnapshot,
    block: int,
    labels: dict[str, str] | None = None,
    info: dict | None = None,
    holds_tokens: bool = True,
) -> str:
    """Hover card for `block`. `info` is the provider's answer (text, token_ids), None while it
    is on its way; `holds_tokens` is False for the shadow allocator, which keeps no K/V."""
    labels = labels or {}
    aside, emphasis = current().card_aside, current().card_emphasis
    state = int(snapshot.state[block])
    bs = snapshot.block_size
    lines = [
        f"<b>Block {block}</b> &nbsp;<span style='color:{aside}'>{escape(snapshot.allocator)}"
        f" pool</span>",
        f"state: {STATE_NAMES.get(state, f'unknown ({state})')}",
    ]
    owners = block_owners(snapshot, block)
    for request_id, seq_id, index in owners[:6]:
        group = group_of(request_id)
        label = labels.get(group)
        name = escape(request_id) + (f" — {escape(label)}" if label else "")
        lines.append(
            f"<span style='color:{colors.group_hex(group)}'>■</span> {name}"
            f" <span style='color:{aside}'>(seq {seq_id}, logical block {index})</span>"
        )
    if len(owners) > 6:
        lines.append(f"… and {len(owners) - 6} more sequences")
    ref = int(snapshot.ref_count[block])
    if ref > 1:
        who = sharers([request_id for request_id, _, _ in owners])
        of_whom = f" of {who}" if who else ""
        lines.append(
            f"<b style='color:{emphasis}'>shared by {ref} sequences{of_whom}</b>"
            f" <span style='color:{aside}'>(ref count {ref}; drawn in the first owner's"
            " colour, with a ring)</span>"
        )
    else:
        lines.append(f"ref count: {ref}")
    if state == BlockState.USED:
        lines.append(f"filled: {int(snapshot.filled[block])} / {bs} slots")
    kv_group = int(snapshot.group[block]) if snapshot.group is not None else -1
    if kv_group >= 0 and has_windows(snapshot):
        lines.append(f"layers: {escape(group_name(snapshot, kv_group))}")
    if snapshot.has_hash[block]:
        reuse = "reusable by a later request" if state == BlockState.CACHED else "full block"
        lines.append(f"hashed prefix block ({reuse})")
    if not holds_tokens:
        lines.append(f"<i style='color:{aside}'>bookkeeping only: the shadow keeps no K/V</i>")
    elif state in (BlockState.USED, BlockState.CACHED):
        lines.append(_info_line(info))
    return "<br>".join(lines)


def _info_line(info: dict | None) -> str:
    p = current()
    if info is None:
        return f"<i style='color:{p.card_aside}'>reading its tokens…</i>"
    if info.get("error"):
        return f"<i style='color:{p.error}'>{escape(str(info['error']))}</i>"
    text = info.get("text") or ""
    count = len(info.get("token_ids") or ())
    body = _shown_text(text) if text else "<i>(no text)</i>"
    return (
        f"<span style='color:{p.card_aside}'>{count} tokens:</span><br>"
        f"<span style='font-family:monospace; color:{p.card_emphasis}'>{body}</span>"
    )
