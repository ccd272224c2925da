"""The torch paged kernels against a dense float64 attention over the same tokens."""

import pytest
import torch
from kernel_cases import dense_attention, random_paged_kv

from kvscope import kernels


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 8, 128), (4, 1, 64)])
def test_decode_matches_dense(block_size, hq, hkv, d):
    lens = [1, 7, block_size, 3 * block_size + 5]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, block_size, 64)
    q = torch.randn(len(lens), hq, d)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), d**-0.5
    )
    for i in range(len(lens)):
        ref = dense_attention(q[i : i + 1], ks[i], vs[i], d**-0.5)
        torch.testing.assert_close(out[i : i + 1].double(), ref, atol=1e-5, rtol=1e-5)
        # A batch of one takes a path of its own (no mask): same answer.
        alone = kernels.paged_decode_attention(
            q[i : i + 1],
            k_cache,
            v_cache,
            tables[i : i + 1],
            torch.tensor(lens[i : i + 1], dtype=torch.int32),
            d**-0.5,
        )
        torch.testing.assert_close(alone.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [8, 16])
def test_prefill_with_cached_prefix_matches_dense(block_size):
    hq, hkv, d = 6, 2, 64
    totals, news = [20, 5, 33], [20, 3, 9]  # full prefill, short extend, extend mid-block
    ks, vs, k_cache, v_cache, tables = random_paged_kv(totals, hkv, d, block_size, 32, seed=1)
    q = torch.randn(sum(news), hq, d)
    starts = torch.tensor([0, 20, 23, 32], dtype=torch.int32)
    out = kernels.paged_prefill_attention(
        q, k_cache, v_cache, tables, starts, torch.tensor(totals, dtype=torch.int32), d**-0.5
    )
    for i, (total, new) in enumerate(zip(totals, news, strict=True)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        ref = dense_attention(q[lo:hi], ks[i], vs[i], d**-0.5, causal_offset=total - new)
        torch.testing.assert_close(out[lo:hi].double(), ref, atol=1e-5, rtol=1e-5)


def test_store_kv_skips_padding_slots():
    k_cache = torch.zeros(2, 4, 1, 2)
    v_cache = torch.zeros(2, 4, 1, 2)
    k = torch.ones(3, 1, 2)
    kernels.store_kv(k, 2 * k, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert k_cache.view(-1, 1, 2)[[0, 5]].eq(1).all()
    assert v_cache.view(-1, 1, 2)[[0, 5]].eq(2).all()
    assert k_cache.sum() == 4  # only the two real slots were written


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend"):
        kernels.store_kv(
            torch.ones(1, 1, 2),
            torch.ones(1, 1, 2),
            torch.zeros(1, 4, 1, 2),
            torch.zeros(1, 4, 1, 2),
            torch.tensor([0]),
            backend="cuda-magic",
        )


def test_fp8_cache_with_per_head_scales():
    """float8 store quantizes K/V / scale (saturating at 448); attention dequantizes on load."""
    fp8 = torch.float8_e4m3fn
    hq, hkv, d, bs = 4, 2, 64, 8
    k = torch.randn(11, hkv, d) * torch.tensor([1.0, 30.0]).view(1, -1, 1)  # heads differ 30x
    v = torch.randn(11, hkv, d)
    k[0, 0, 0] = 1e6  # far past the range: saturates instead of turning into NaN
    k_scale, v_scale = torch.tensor([4.0, 120.0]) / 448, torch.tensor([4.0, 4.0]) / 448
    k_cache = torch.zeros(4, bs, hkv, d, dtype=fp8)
    v_cache = torch.zeros(4, bs, hkv, d, dtype=fp8)
    table = [2, 0]
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(11)])
    kernels.store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    stored = k_cache.view(-1, hkv, d)[slots].float()
    assert stored[0, 0, 0] == 448 and stored.isfinite().all()
    kd = stored * k_scale.view(-1, 1)
    vd = v_cache.view(-1, hkv, d)[slots].float() * v_scale.view(-1, 1)
    # Rounding to e4m3 (3 mantissa bits) keeps every value within 1/16 of itself.
    torch.testing.assert_close(kd[1:], k[1:], rtol=1 / 16, atol=k_scale.max() * 2**-9)
    q = torch.randn(1, hq, d)
    tables = torch.tensor([table], dtype=torch.int32)
    out = kernels.paged_decode_attention(
        q,
        k_cache,
        v_cache,
        tables,
        torch.tensor([11], dtype=torch.int32),
        d**-0.5,
        k_scale,
        v_scale,
    )
    dense = dense_attention(q, kd, vd, d**-0.5)
    torch.testing.assert_close(out.double(), dense, atol=1e-5, rtol=1e-5)
    qs = torch.randn(11, hq, d)
    out = kernels.paged_prefill_attention(
        qs,
        k_cache,
        v_cache,
        tables,
        torch.tensor([0, 11], dtype=torch.int32),
        torch.tensor([11], dtype=torch.int32),
        d**-0.5,
        k_scale,
        v_scale,
    )
    dense = dense_attention(qs, kd, vd, d**-0.5, causal_offset=0)
    torch.testing.assert_close(out.double(), dense, atol=1e-5, rtol=1e-5)
