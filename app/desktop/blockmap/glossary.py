"""The block map's terms in plain words: one sentence each, shown as the tooltip of every tile,
caption and key entry that uses the term, so a newcomer can point at a word and learn it."""

from __future__ import annotations

TERMS = {
    "held": (
        "Held: blocks that sequences own right now, used or reserved. Nobody else can have them"
        " until their sequence finishes."
    ),
    "useful slots": (
        "Useful slots: the share of held slots (one slot = one token's K/V) that actually hold"
        " K/V. The rest is waste: the empty tail of each sequence's last block, and for the"
        " naive allocator whole reserved-but-unwritten blocks. Shown as '—' when nothing is"
        " held."
    ),
    "holes": (
        "Holes: runs of free blocks with held blocks on both sides. The naive allocator needs"
        " one run as long as a whole reservation, so free blocks scattered in holes can be"
        " useless to it (external fragmentation); the paged pool can use any free block."
    ),
    "same traffic": (
        "Same traffic: the naive map is not a second engine. Every request the paged engine"
        " admits, grows and frees is replayed on a contiguous allocator of the same size, which"
        " reserves max model length per sequence; what it cannot place waits."
    ),
    "shared": (
        "Shared: a block in several sequences' tables (ref count > 1), e.g. a system prompt"
        " common to several chats or the prompt of n samples. Drawn with a light ring in its"
        " first owner's colour; its tooltip says how many sequences and chats share it."
    ),
    "cached": (
        "Cached: a free block that still holds a full prompt prefix; a later request with the"
        " same prefix adopts it instead of recomputing it."
    ),
    "reserved": (
        "Reserved: held by the naive allocator for a sequence that has not written that far;"
        " it can never be lent to anyone else."
    ),
    "preempted": (
        "Preempted: a running sequence whose blocks were taken back when the pool ran dry; it"
        " waits and recomputes its K/V when readmitted."
    ),
}


def explain(*terms: str) -> str:
    """Rich-text tooltip explaining the given terms, one paragraph each."""
    return "".join(f"<p>{TERMS[t]}</p>" for t in terms)
