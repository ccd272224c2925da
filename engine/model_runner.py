"""Turns a scheduled batch into the flat tensors the model and kernels consume, and runs it.

This is the boundary between Python scheduling and compute: token ids, positions, slot_mapping,
block tables and lengths, one set per KV group (a model whose layers differ has several; see
`engine.kv.layout`). Everything it needs comes in the batch (block tables included), so it never
asks the allocator; nothing past it knows about Sequence objects.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.model.llama import LlamaModel
from kvscope.engine.scheduler import ScheduledBatch
from kvscope.engine.sequence import Sequence


class StepRunner(Protocol):
    """What the engine runs a scheduled batch with: the model (ModelRunner), or a what-if
    simulation's recorded steps."""

    def execute(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]: ...


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device

    def execute(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        """Run one step. Returns the sequences that reached their last token and their logits."""
        self.kv_cache.copy_blocks(batch.block_copies)
        items, tables = batch.items, batch.group_tables
        decodes = [(s, n) for s, n in items if n == 1]
        prefills = [(s, n) for s, n in items if n > 1]
        ordered = decodes + prefills
        bs = self.kv_cache.block_size

        input_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        samplers: list[Sequence] = []
        for seq, n in ordered:
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            if start + n == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                samplers.append(seq)

        # One metadata per KV group: each group's tables name its own blocks for the tokens.
        num_groups = len(next(iter(tables.values()))) if tables else 1
        metas = []
        for g in range(num_groups):
            slots: list[int] = []
            for seq, n in ordered:
                start = seq.num_computed_tokens
                table = tables[seq.seq_id][g]
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            metas.append(
                AttentionMetadata(
                    slot_mapping=self._tensor(slots, torch.int64),
                    num_decode_tokens=len(decodes),
                    decode_block_tables=self._tables([tables[s.seq_id][g] for s, _ in decodes]),
                    decode_seq_lens=self._lens([s.num_computed_tokens + 1 for s, _ in decodes]),
                    prefill_block_tables=self._tables([tables[s.seq_id][g] for s, _ in prefills]),
                    prefill_query_start_loc=self._query_starts([n for _, n in prefills]),
                    prefill_seq_lens=self._lens([s.num_computed_tokens + n for s, n in prefills]),
                )
            )
        hidden = self.model.forward(
            self._tensor(input_ids, torch.int64),
            self._tensor(positions, torch.int64),
            self.kv_cache,
            metas[0] if num_groups == 1 else metas,
        )
        for seq, n in items:
            seq.num_computed_tokens += n
        if not samplers:
            return [], hidden.new_empty((0, 0), dtype=torch.float32)
        rows = self._tensor(sample_rows, torch.int64)
        return samplers, self.model.compute_logits(hidden.index_select(0, rows))

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _tables(self, tables: list[tuple[int, ...]]) -> torch.Tensor | None:
        if not tables:
            return None
        width = max(len(t) for t in tables)
        # Padding and released entries (NULL_BLOCK, before a sliding window) point at block 0:
        # kernels never read past seq_len, nor blocks wholly before the window.
        rows = [
            (list(t) if -1 not in t else [max(b, 0) for b in t]) + [0] * (width - len(t))
            for t in tables
        ]
        return self._tensor(rows, torch.int32)

    def _lens(self, lens: list[int]) -> torch.Tensor | None:
        return self._tensor(lens, torch.int32) if lens else None

    def _query_starts(self, counts: list[int]) -> torch.Tensor | None:
        if not counts:
            return None
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        return self._tensor(starts, torch.int32)
