"""Inputs and the oracle the kernel tests share: random K/V scattered over a paged cache, and a
dense float64 attention over the same tokens."""

import torch

from kvscope import kernels


def scatter_cache(seqs_k, seqs_v, block_size, num_blocks, hkv, d, seed=0):
    """Place each sequence's K/V into randomly chosen (scattered) physical blocks."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    # Other slots hold huge stale values: none of them may reach the output.
    k_cache = torch.randn((num_blocks, block_size, hkv, d), generator=g) * 1e4
    v_cache = torch.randn((num_blocks, block_size, hkv, d), generator=g) * 1e4
    tables = []
    for k, v in zip(seqs_k, seqs_v, strict=True):
        n_blocks = -(-k.shape[0] // block_size)
        table = [perm.pop() for _ in range(n_blocks)]
        slots = torch.tensor(
            [table[p // block_size] * block_size + p % block_size for p in range(k.shape[0])]
        )
        kernels.store_kv(k, v, k_cache, v_cache, slots)
        tables.append(table)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, block_tables


def random_paged_kv(lens, hkv, d, block_size, num_blocks, seed=0):
    """Random K/V (torch's global generator) for sequences of `lens` tokens, scattered into a
    cache by `scatter_cache`: (ks, vs, k_cache, v_cache, block_tables)."""
    ks = [torch.randn(n, hkv, d) for n in lens]
    vs = [torch.randn(n, hkv, d) for n in lens]
    return (ks, vs, *scatter_cache(ks, vs, block_size, num_blocks, hkv, d, seed))


def dense_attention(q, k, v, scale, causal_offset=None, window=None):
    """float64 reference; q [n, Hq, D], k/v [L, Hkv, D]. Query i sits at position
    causal_offset + i (None: every query sees every key); with a window W it sees keys
    p - W < j <= p only (a decode query is the last position, p = L - 1)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal_offset is not None:
        qpos = torch.arange(q.shape[0]).view(-1, 1) + causal_offset
        scores = scores.masked_fill(torch.arange(k.shape[0]).view(1, -1) > qpos, float("-inf"))
    if window is not None:
        offset = k.shape[0] - q.shape[0] if causal_offset is None else causal_offset
        qpos = torch.arange(q.shape[0]).view(-1, 1) + offset
        too_old = torch.arange(k.shape[0]).view(1, -1) <= qpos - window
        scores = scores.masked_fill(too_old, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
