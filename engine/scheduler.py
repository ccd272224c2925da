"""Continuous batching: which sequences run this step, and how many tokens each computes.

Every step, running sequences go first (decodes cost one token each, so they are never starved by a
long prompt), then waiting ones are admitted while blocks, `max_num_seqs` and the token budget
allow. Prompts longer than the remaining budget are prefilled in chunks over several steps; while
decodes run, a step's prompt tokens are capped lower (`prefill_beside_decodes`), since every
decode in the step waits for the chunk. A
running sequence's sliding-window groups give back the blocks that fell out of the window before
it grows (`release_outside_window`). When
the pool runs dry the newest running sequence is preempted by recompute: its blocks are freed and
it goes back to the front of the queue to be prefilled again later.

The scheduler announces every change of a sequence's life (added, admitted, forked, preempted,
finished) on the event log; the allocator announces the block changes these cause.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvscope.engine.kv.allocator import KVAllocator, NoFreeBlocksError, PrefixMatch
from kvscope.engine.kv.events import (
    EventLog,
    SequenceAdded,
    SequenceAdmitted,
    SequenceFinished,
    SequencePreempted,
)
from kvscope.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    # (sequence, tokens to compute this step), in the order the model runner lays them out.
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # (src, dst) physical block copies to perform before the step: copy-on-write of shared blocks.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # seq_id -> its (group 0) block table as scheduled.
    block_tables: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # seq_id -> every KV group's table: all the model runner needs of the allocator.
    group_tables: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)


class Scheduler:
    def __init__(
        self,
        allocator: KVAllocator,
        events: EventLog,
        max_num_seqs: int,
        max_batched_tokens: int,
        prefill_beside_decodes: int | None = None,
    ) -> None:
        """`prefill_beside_decodes`: prompt tokens a step takes at most when it also runs decodes
        (None: the whole budget); EngineConfig.prefill_tokens_beside_decodes says why."""
        self.allocator = allocator
        self.events = events
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.prefill_beside_decodes = prefill_beside_decodes
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.peak_num_running = 0

    def announce(self, seq: Sequence) -> None:
        """Tell observers a sample exists; it shows as waiting until admitted or forked."""
        self.events.emit(
            SequenceAdded,
            seq_id=seq.seq_id,
            request_id=seq.request.request_id,
            sample=seq.index,
            num_prompt_tokens=seq.num_prompt_tokens,
        )

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_batched_tokens
        bm = self.allocator
        # Decodes (one token) before prefill chunks, so a long prompt never stalls running chats.
        ordered = sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1)
        scheduled_ids: set[int] = set()
        for seq in ordered:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new > 1:  # a prompt chunk: decodes (sorted first) are in the batch already
                num_new = min(num_new, self._prefill_room(batch, budget))
                if num_new == 0:
                    break
            target = seq.num_computed_tokens + num_new
            # Sliding groups first give back what fell out of the window of this step's first
            # token, so growth can reuse it.
            bm.release_outside_window(seq.seq_id, seq.num_computed_tokens)
            # The engine caps every sequence at the pool's size, so this loop always ends: at
            # worst `seq` preempts itself and waits for the sequences scheduled before it.
            write_from = seq.num_computed_tokens
            while not bm.can_grow(seq.seq_id, target, write_from):
                victim = self._newest_running(exclude=scheduled_ids)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            batch.block_copies += bm.grow(seq.seq_id, target, write_from)
            batch.items.append((seq, num_new))
            scheduled_ids.add(seq.seq_id)
            budget -= num_new

        # Admit waiting sequences only when nothing was preempted: admitting now would thrash.
        while (
            self.waiting
            and not batch.preempted
            and budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            match = bm.match_prefix(seq.token_ids)
            num_cached = len(match.block_ids) * bm.block_size
            num_new = min(seq.num_tokens - num_cached, self._prefill_room(batch, budget))
            if num_new == 0 or not bm.can_adopt(match, num_cached + num_new):
                break
            self.waiting.popleft()
            self._admit(seq, match, num_cached + num_new)
            batch.items.append((seq, num_new))
            budget -= num_new
        return self._with_tables(batch)

    def _prefill_room(self, batch: ScheduledBatch, budget: int) -> int:
        """Prompt tokens this step may still take: the budget, or with decodes in the batch
        what `prefill_beside_decodes` leaves after the chunks scheduled so far."""
        cap = self.prefill_beside_decodes
        if cap is None or not any(n == 1 for _, n in batch.items):
            return budget
        taken = sum(n for _, n in batch.items if n > 1)
        return max(0, min(budget, cap - taken))

    def admit(self, seq: Sequence) -> bool:
        """Admit a sequence built outside the queue (a beam search's prompt) now, with room for
        all its tokens; False, changing nothing, when the pool has no room."""
        match = self.allocator.match_prefix(seq.token_ids)
        if not self.allocator.can_adopt(match, seq.num_tokens):
            return False
        self._admit(seq, match, seq.num_tokens)
        return True

    def schedule_exactly(self, seqs: list[Sequence]) -> ScheduledBatch:
        """A batch of exactly `seqs`, each computing all its uncomputed tokens (beam search's
        step). Nothing is preempted: NoFreeBlocksError when the pool cannot hold them."""
        batch = ScheduledBatch()
        for seq in seqs:
            write_from = seq.num_computed_tokens
            self.allocator.release_outside_window(seq.seq_id, write_from)
            if not self.allocator.can_grow(seq.seq_id, seq.num_tokens, write_from):
                raise NoFreeBlocksError(
                    f"no room for sequence {seq.seq_id}'s {seq.num_tokens} tokens"
                )
            batch.block_copies += self.allocator.grow(seq.seq_id, seq.num_tokens, write_from)
            batch.items.append((seq, seq.num_tokens - write_from))
        return self._with_tables(batch)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start `child` running on a copy-on-write share of every block of `parent`."""
        self.allocator.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        self.peak_num_running = max(self.peak_num_running, len(self.running))

    def finish(self, seq: Sequence) -> None:
        """Release a sequence's blocks and drop it from the queues (finished or aborted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        self.events.emit(SequenceFinished, seq_id=seq.seq_id, reason=seq.finish_reason)

    def _admit(self, seq: Sequence, match: PrefixMatch, total_tokens: int) -> None:
        bm = self.allocator
        bm.adopt(seq.seq_id, match)
        bm.grow(seq.seq_id, total_tokens)
        num_cached = len(match.block_ids) * bm.block_size
        seq.num_computed_tokens = num_cached
        first = seq.num_cached_tokens is None
        if first:
            seq.num_cached_tokens = num_cached
        self.events.emit(
            SequenceAdmitted,
            seq_id=seq.seq_id,
            query_tokens=seq.num_tokens,
            hit_tokens=num_cached,
            first=first,
        )
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.peak_num_running = max(self.peak_num_running, len(self.running))

    def _with_tables(self, batch: ScheduledBatch) -> ScheduledBatch:
        for seq, _ in batch.items:
            tables = self.allocator.tables_of(seq.seq_id)
            batch.group_tables[seq.seq_id] = tables
            batch.block_tables[seq.seq_id] = tables[0]
        return batch

    def _newest_running(self, exclude: set[int]) -> Sequence:
        return next(s for s in reversed(self.running) if s.seq_id not in exclude)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.allocator.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.events.emit(SequencePreempted, seq_id=seq.seq_id)
