"""Sliding-window attention in the torch kernels against a dense masked float64 attention: a
query at position p sees keys p - W < j <= p, and blocks wholly before the window are never
read (their table entries may name blocks already given back)."""

import pytest
import torch
from kernel_cases import dense_attention, random_paged_kv

from kvscope import kernels

STALE = 10**6  # a block id far outside the pool: reading it would raise


def _forget_blocks_before_window(tables, lens, window, block_size):
    """Table entries wholly older than each sequence's window point nowhere valid (the engine
    gives them back); the kernels must not read them."""
    tables = tables.clone()
    for i, n in enumerate(lens):
        first_needed = max(0, n - window) // block_size
        tables[i, :first_needed] = STALE
    return tables


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("window", [1, 5, 8, 19, 1000])
@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 64), (4, 1, 32)])
def test_decode_window_matches_dense(block_size, window, hq, hkv, d):
    lens = [1, 7, block_size, 3 * block_size + 5, 61]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, block_size, 64)
    q = torch.randn(len(lens), hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    # Valid ids everywhere for the batch (it gathers from the earliest window of all), stale
    # ones for each sequence alone.
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, d**-0.5, sliding_window=window
    )
    alone_tables = _forget_blocks_before_window(tables, lens, window, block_size)
    for i in range(len(lens)):
        ref = dense_attention(q[i : i + 1], ks[i], vs[i], d**-0.5, window=window)
        torch.testing.assert_close(out[i : i + 1].double(), ref, atol=1e-5, rtol=1e-5)
        alone = kernels.paged_decode_attention(
            q[i : i + 1],
            k_cache,
            v_cache,
            alone_tables[i : i + 1],
            seq_lens[i : i + 1],
            d**-0.5,
            sliding_window=window,
        )
        torch.testing.assert_close(alone.double(), ref, atol=1e-5, rtol=1e-5)


def test_decode_window_differs_from_full_attention():
    """The window really cuts: past it, the answer is not full attention's."""
    ks, vs, k_cache, v_cache, tables = random_paged_kv([40], 2, 32, 8, 16)
    q = torch.randn(1, 2, 32)
    lens = torch.tensor([40], dtype=torch.int32)
    full = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 32**-0.5)
    slid = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 32**-0.5, sliding_window=10
    )
    assert not torch.allclose(full, slid, atol=1e-3)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("window", [1, 6, 16, 23, 1000])
def test_prefill_window_matches_dense(block_size, window):
    hq, hkv, d = 6, 2, 64
    # full prefill, short extend, extend mid-block, a long extend far past the window
    totals, news = [20, 5, 33, 70], [20, 3, 9, 40]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(totals, hkv, d, block_size, 64, seed=1)
    first_queries = [t - n + 1 for t, n in zip(totals, news, strict=True)]
    tables = _forget_blocks_before_window(tables, first_queries, window, block_size)
    q = torch.randn(sum(news), hq, d)
    starts = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32)
    out = kernels.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        starts,
        torch.tensor(totals, dtype=torch.int32),
        d**-0.5,
        sliding_window=window,
    )
    for i, (total, new) in enumerate(zip(totals, news, strict=True)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        ref = dense_attention(
            q[lo:hi], ks[i], vs[i], d**-0.5, causal_offset=total - new, window=window
        )
        torch.testing.assert_close(out[lo:hi].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, -3])
def test_bad_window_is_rejected(window):
    ks, vs, k_cache, v_cache, tables = random_paged_kv([4], 1, 8, 4, 4)
    with pytest.raises(ValueError, match="sliding_window"):
        kernels.paged_decode_attention(
            torch.randn(1, 1, 8),
            k_cache,
            v_cache,
            tables,
            torch.tensor([4], dtype=torch.int32),
            1.0,
            sliding_window=window,
        )


# ---- Triton, in the interpreter (conftest sets TRITON_INTERPRET=1) --------------------------
def _interpreted() -> bool:
    try:
        from kvscope.kernels.triton_common import INTERPRETED
    except ImportError:  # no triton installed
        return False
    return INTERPRETED


triton_only = pytest.mark.skipif(
    not _interpreted(), reason="needs triton and TRITON_INTERPRET=1 before triton is imported"
)


@triton_only
@pytest.mark.parametrize("window", [1, 13, 40, 1000])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_decode_window_matches_dense(window, num_splits):
    """Tiles wholly before the window are skipped (stale table entries would fault the
    interpreter's loads), split-K partitions cover the window only."""
    from kvscope.kernels.triton_decode import paged_decode_attention_triton

    hq, hkv, d, bs = 4, 2, 32, 8
    lens = [1, 9, 70, 150]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, bs, 48, seed=5)
    tables = _forget_blocks_before_window(tables, lens, window, bs)
    q = torch.randn(len(lens), hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention_triton(
        q,
        k_cache,
        v_cache,
        tables,
        seq_lens,
        d**-0.5,
        sliding_window=window,
        num_splits=num_splits,
    )
    for i in range(len(lens)):
        ref = dense_attention(q[i : i + 1], ks[i], vs[i], d**-0.5, window=window)
        torch.testing.assert_close(out[i : i + 1].double(), ref, atol=2e-5, rtol=2e-5)


@triton_only
@pytest.mark.parametrize("window", [1, 7, 33, 1000])
def test_triton_prefill_window_matches_dense(window):
    """Rows of a query tile whose window starts past the first key tile (window < tile) stay
    finite; a chunk longer than a tile after a prefix longer than the window."""
    hq, hkv, d, bs = 4, 1, 32, 8
    totals, news = [20, 5, 110], [20, 3, 70]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(totals, hkv, d, bs, 40, seed=6)
    first_queries = [t - n + 1 for t, n in zip(totals, news, strict=True)]
    tables = _forget_blocks_before_window(tables, first_queries, window, bs)
    q = torch.randn(sum(news), hq, d)
    starts = torch.tensor([0, 20, 23, 93], dtype=torch.int32)
    out = kernels.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        starts,
        torch.tensor(totals, dtype=torch.int32),
        d**-0.5,
        backend="triton",
        sliding_window=window,
    )
    assert torch.isfinite(out).all()
    for i, (total, new) in enumerate(zip(totals, news, strict=True)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        ref = dense_attention(
            q[lo:hi], ks[i], vs[i], d**-0.5, causal_offset=total - new, window=window
        )
        torch.testing.assert_close(out[lo:hi].double(), ref, atol=2e-5, rtol=2e-5)
