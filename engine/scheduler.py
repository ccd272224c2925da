"""Continuous batching: which sequences run this step, and how many tokens each computes.

Every step, running sequences go first (decodes cost one token each, so they are never starved by a
long prompt), then waiting ones are admitted while blocks, `max_num_seqs` and the token budget
allow. Prompts longer than the remaining budget are prefilled in chunks over several steps. When
the pool runs dry the newest running sequence is preempted by recompute: its blocks are freed and
it goes back to the front of the queue to be prefilled again later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.kv.block_manager import BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    # (sequence, tokens to compute this step), in the order the model runner lays them out.
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # (src, dst) physical block copies to perform before the step: copy-on-write of shared blocks.
    block_copies: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.peak_num_running = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one: its blocks are already in place."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.peak_num_running = max(self.peak_num_running, len(self.running))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_batched_tokens
        bm = self.block_manager
        # Decodes (one token) before prefill chunks, so a long prompt never stalls running chats.
        ordered = sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1)
        scheduled_ids: set[int] = set()
        for seq in ordered:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            target = seq.num_computed_tokens + num_new
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
            num_new = min(seq.num_tokens - num_cached, budget)
            if not bm.can_adopt(match, num_cached + num_new):
                break
            self.waiting.popleft()
            bm.adopt(seq.seq_id, match)
            bm.grow(seq.seq_id, num_cached + num_new)
            seq.num_computed_tokens = num_cached
            first = seq.num_cached_tokens is None
            if first:
                seq.num_cached_tokens = num_cached
            if bm.events is not None:
                bm.events.emit(
                    "admit",
                    seq.seq_id,
                    query_tokens=seq.num_tokens,
                    hit_tokens=num_cached,
                    first=first,
                )
            self.prefix_query_tokens += seq.num_tokens
            self.prefix_hit_tokens += num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.items.append((seq, num_new))
            budget -= num_new
        self.peak_num_running = max(self.peak_num_running, len(self.running))
        return batch

    def finish(self, seq: Sequence) -> None:
        """Release a sequence's blocks and drop it from the queues (finished or aborted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        if self.block_manager.events is not None:
            self.block_manager.events.emit("finish", seq.seq_id, reason=seq.finish_reason)

    def _newest_running(self, exclude: set[int]) -> Sequence:
        return next(s for s in reversed(self.running) if s.seq_id not in exclude)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        if self.block_manager.events is not None:
            self.block_manager.events.emit("preempt", seq.seq_id)
