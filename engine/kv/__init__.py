"""The paged KV cache: the allocators (paged, contiguous) behind one interface, the cache tensors,
the pool's events and observers, snapshots, recordings and their replay."""
