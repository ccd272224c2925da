"""One physical KV block's bookkeeping: its references, and the prefix it holds once hashed.

Shared by the allocation (engine.kv.paged) and the prefix-cache index
(engine.kv.prefix_index), below both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # What a hashed block holds: its tokens and its parent block's hash. A hit compares both, so
    # a hash collision can never serve KV of other tokens or of another position.
    token_ids: tuple[int, ...] | None = None
    parent_hash: int | None = None
    group: int = 0  # the KV group whose layers it holds (while used or cached)
