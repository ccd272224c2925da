"""Each recorded event checked against the replayed pool before it is applied.

`PoolTelemetry` trusts its events: the live engine's follow by construction, and checking them
there would cost every step. A session file's are data. Unchecked, a block id of 10^30 is an
OverflowError in numpy, a KV group of 200 overflows the int8 group array, a `start` of 10^9
pads a table with a billion entries, and a block freed twice (or by a sequence that never held
it) drives a ref count below zero without a word. `EventCheck` sees each event first and raises
ValueError saying what is out of range or does not follow, so a replay either rebuilds the pool
the engine had or names the first event that could not have happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from kvscope.engine.kv.events import (
    BlockCopiedOnWrite,
    BlockEvicted,
    BlocksAllocated,
    BlocksFreed,
    BlocksHashed,
    BlocksReleased,
    BlocksReserved,
    KVEvent,
    PrefixCacheHit,
    SequenceAdded,
    SequenceAdmitted,
    SequenceForked,
    SequencePreempted,
    StepProgress,
)
from kvscope.engine.kv.snapshot import BlockState
from kvscope.engine.kv.telemetry import NULL, PoolTelemetry, SequenceTrack

# Table entries all sequences together may hold: a sliding group's table keeps a NULL for each
# block it gave back, so a one-line cache hit with a large `start` would otherwise cost 8 bytes
# per entry. Real sessions hold about one entry per pool block per group (more with forks).
MIN_TABLE_ENTRIES = 1 << 24


class EventCheck:
    """Raises ValueError for an event that is out of range or does not follow from the pool
    `telemetry` holds; call it before the telemetry applies the event."""

    def __init__(self, telemetry: PoolTelemetry, max_table: int) -> None:
        self.telemetry = telemetry
        self.num_groups = len(telemetry.group_windows)
        self.max_table = max_table  # entries one table can have: max_seq_len / block_size
        self.max_entries = max(MIN_TABLE_ENTRIES, 4 * telemetry.num_blocks * self.num_groups)
        self.entries = 0  # table entries held now (recounted at every step's end)

    def __call__(self, event: KVEvent) -> None:
        self._ranges(event)
        check = self._CHECKS.get(type(event))
        if check is not None:
            check(self, event)
        elif isinstance(event, StepProgress):  # a step's end: recount what the tables hold
            tracks = self.telemetry.seqs.values()
            self.entries = sum(len(t) for track in tracks for t in track.tables.values())

    # ---- ranges: every block, group and position against the header ----------------------
    def _ranges(self, e: Any) -> None:
        n = self.telemetry.num_blocks
        blocks = getattr(e, "blocks", ())
        for b in (*blocks, *(getattr(e, k) for k in ("block", "src", "dst") if hasattr(e, k))):
            if b >= n:
                raise ValueError(f"block {b} is outside the recorded pool of {n:,} blocks")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"lists a block twice: {_cut(blocks)}")
        group = getattr(e, "group", 0)
        if group >= self.num_groups:
            raise ValueError(f"group {group} is not below the recording's {self.num_groups} groups")
        end = max(getattr(e, "start", 0) + len(blocks), getattr(e, "index", -1) + 1)
        if end > self.max_table:
            raise ValueError(
                f"reaches table entry {end:,}; a sequence's table has at most "
                f"{self.max_table:,} (max_seq_len / block_size)"
            )

    # ---- does it follow: each kind against what the pool and the sequence hold ------------
    def _track(self, seq_id: int) -> SequenceTrack:
        track = self.telemetry.seqs.get(seq_id)
        if track is None:
            raise ValueError(f"sequence {seq_id} was never added")
        return track

    def _grow(self, count: int) -> None:
        self.entries += count
        if self.entries > self.max_entries:
            raise ValueError(
                f"the sequences' tables would hold over {self.max_entries:,} entries, more than "
                "a pool of this size ever has"
            )

    def _free_blocks(self, blocks: tuple[int, ...], seq_id: int) -> None:
        """Each of `blocks` must be unreferenced: free, or reserved by `seq_id`."""
        t = self.telemetry
        for b in blocks:
            reserved = t.state[b] == BlockState.RESERVED and t.owner[b] == seq_id
            if t.ref_count[b] or not (t.state[b] == BlockState.FREE or reserved):
                raise ValueError(f"block {b} is not free ({_state(t, b)})")

    def _no_live_table(self, track: SequenceTrack, seq_id: int, group: int) -> None:
        if any(b != NULL for b in track.tables.get(group, ())):
            raise ValueError(f"sequence {seq_id} holds group {group} blocks already")

    def _on_added(self, e: SequenceAdded) -> None:
        if e.seq_id in self.telemetry.seqs:
            raise ValueError(f"sequence {e.seq_id} was added already")

    def _on_admitted(self, e: SequenceAdmitted) -> None:
        self._track(e.seq_id)
        if e.hit_tokens > e.query_tokens:
            raise ValueError(f"hit_tokens {e.hit_tokens} exceeds query_tokens {e.query_tokens}")

    def _on_reserved(self, e: BlocksReserved) -> None:
        if self._track(e.seq_id).reserved:
            raise ValueError(f"sequence {e.seq_id} holds a reservation already")
        self._free_blocks(e.blocks, -1)

    def _on_allocated(self, e: BlocksAllocated) -> None:
        table = self._track(e.seq_id).tables.get(e.group, [])
        if e.start != len(table):
            raise ValueError(
                f"start {e.start}, but sequence {e.seq_id}'s group {e.group} "
                f"table has {len(table)} entries"
            )
        self._free_blocks(e.blocks, e.seq_id)
        self._grow(len(e.blocks))

    def _on_cache_hit(self, e: PrefixCacheHit) -> None:
        track = self._track(e.seq_id)
        self._no_live_table(track, e.seq_id, e.group)
        for b in e.blocks:
            if not self.telemetry.has_hash[b]:
                raise ValueError(f"block {b} holds no cached prefix")
        self._grow(e.start + len(e.blocks))

    def _on_hashed(self, e: BlocksHashed) -> None:
        self._track(e.seq_id)
        for b in e.blocks:
            if not self.telemetry.ref_count[b]:
                raise ValueError(f"block {b} is hashed but nobody holds it")

    def _on_evicted(self, e: BlockEvicted) -> None:
        if self.telemetry.state[e.block] != BlockState.CACHED:
            state = _state(self.telemetry, e.block)
            raise ValueError(f"block {e.block} is evicted but not cached ({state})")

    def _on_copied(self, e: BlockCopiedOnWrite) -> None:
        table = self._track(e.seq_id).tables.get(e.group, [])
        held = table[e.index] if e.index < len(table) else None
        if held != e.src or self.telemetry.ref_count[e.src] < 2:
            raise ValueError(
                f"sequence {e.seq_id} does not share block {e.src} at "
                f"group {e.group} index {e.index}"
            )
        self._free_blocks((e.dst,), e.seq_id)

    def _on_forked(self, e: SequenceForked) -> None:
        self._no_live_table(self._track(e.seq_id), e.seq_id, e.group)
        parent = self._track(e.parent).tables.get(e.group, [])
        if parent[e.start :] != list(e.blocks):
            raise ValueError(
                f"parent {e.parent}'s group {e.group} table from {e.start} "
                f"is {_cut(parent[e.start :])}, not {_cut(e.blocks)}"
            )
        self._grow(e.start + len(e.blocks))

    def _on_freed(self, e: BlocksFreed) -> None:
        track = self._track(e.seq_id)
        table = track.tables.get(e.group)
        if table is None and not (track.reserved and not e.blocks):
            raise ValueError(
                f"sequence {e.seq_id} holds no group {e.group} blocks to free "
                f"(freed twice, or never allocated): {_cut(e.blocks)}"
            )
        self._holds(e.seq_id, e.group, table or [], e.start, e.blocks, "frees")
        self.entries -= len(table or ())

    def _on_released(self, e: BlocksReleased) -> None:
        table = self._track(e.seq_id).tables.get(e.group, [])
        self._holds(
            e.seq_id, e.group, table[: e.start + len(e.blocks)], e.start, e.blocks, "releases"
        )

    @staticmethod
    def _holds(
        seq_id: int, group: int, table: list[int], start: int, blocks: tuple[int, ...], verb: str
    ) -> None:
        if table[start:] != list(blocks):
            raise ValueError(
                f"sequence {seq_id} {verb} {_cut(blocks)} from group {group} "
                f"entry {start}, but holds {_cut(table[start:])} there"
            )

    def _on_preempted(self, e: SequencePreempted) -> None:
        self._track(e.seq_id)

    _CHECKS: ClassVar[dict[type[KVEvent], Callable[[EventCheck, Any], None]]] = {
        SequenceAdded: _on_added,
        SequenceAdmitted: _on_admitted,
        BlocksReserved: _on_reserved,
        BlocksAllocated: _on_allocated,
        PrefixCacheHit: _on_cache_hit,
        BlocksHashed: _on_hashed,
        BlockEvicted: _on_evicted,
        BlockCopiedOnWrite: _on_copied,
        SequenceForked: _on_forked,
        BlocksFreed: _on_freed,
        BlocksReleased: _on_released,
        SequencePreempted: _on_preempted,
    }


def _cut(blocks: Any) -> str:
    blocks = list(blocks)
    return str(blocks) if len(blocks) <= 8 else f"[{', '.join(map(str, blocks[:8]))}, …]"


def _state(telemetry: PoolTelemetry, block: int) -> str:
    name = BlockState(int(telemetry.state[block])).name.lower()
    return f"{name}, {int(telemetry.ref_count[block])} references"
