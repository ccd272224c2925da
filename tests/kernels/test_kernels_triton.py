"""The Triton kernels, run in Triton's interpreter on CPU (conftest sets TRITON_INTERPRET=1),
against the torch reference and a dense float64 attention over the same tokens."""

import pytest
import torch
from kernel_cases import dense_attention, random_paged_kv
from tiny_models import make_tiny_model

from kvscope import kernels
from kvscope.kernels.triton_common import INTERPRETED
from kvscope.kernels.triton_decode import decode_num_splits, paged_decode_attention_triton

pytestmark = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 before triton is imported"
)

FP8 = torch.float8_e4m3fn


def _fp8_scales(ks, vs):
    """Per-KV-head scales from the data's amax (with headroom), as the engine's calibration."""
    k_amax = torch.cat(ks).abs().amax(dim=(0, 2))
    v_amax = torch.cat(vs).abs().amax(dim=(0, 2))
    return 2 * k_amax / 448, 2 * v_amax / 448


def _paged(lens, hkv, d, block_size, num_blocks, fp8=False, seed=0):
    """Random K/V in scattered caches (`random_paged_kv`), plus scales and the values the cache
    really holds."""
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, block_size, num_blocks, seed)
    if not fp8:
        return k_cache, v_cache, tables, None, None, ks, vs
    k_scale, v_scale = _fp8_scales(ks, vs)
    k8, v8 = k_cache.to(FP8), v_cache.to(FP8)  # stale slots: finite fp8 garbage
    for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
        bs = block_size
        slots = torch.tensor([int(tables[i, p // bs]) * bs + p % bs for p in range(k.shape[0])])
        kernels.store_kv(k, v, k8, v8, slots, k_scale, v_scale, backend="torch")
    # What the model effectively attends to: K/V rounded through fp8 and scaled back.
    kq = [(k / k_scale.view(-1, 1)).to(FP8).float() * k_scale.view(-1, 1) for k in ks]
    vq = [(v / v_scale.view(-1, 1)).to(FP8).float() * v_scale.view(-1, 1) for v in vs]
    return k8, v8, tables, k_scale, v_scale, kq, vq


@pytest.mark.parametrize(
    "hq,hkv,d,block_size,fp8",
    [
        (9, 3, 64, 16, False),  # the bundled model's GQA ratio 3
        (8, 2, 128, 8, False),  # ratio 4, head dim 128
        (4, 4, 64, 32, False),  # MHA
        (4, 2, 96, 16, False),  # a head dim that is not a power of two (masked lanes)
        (8, 1, 64, 16, True),  # MQA, fp8
        (6, 2, 128, 32, True),
    ],
)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_matches_torch_and_dense(hq, hkv, d, block_size, fp8, num_splits):
    torch.manual_seed(hq * d + block_size)
    lens = [1, 7, block_size + 1, 130]
    k_cache, v_cache, tables, k_scale, v_scale, kd, vd = _paged(lens, hkv, d, block_size, 48, fp8)
    q = torch.randn(len(lens), hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, seq_lens, d**-0.5, k_scale, v_scale)
    out = paged_decode_attention_triton(*args, num_splits=num_splits)
    ref = kernels.paged_decode_attention(*args, backend="torch")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    for i in range(len(lens)):
        dense = dense_attention(q[i : i + 1], kd[i], vd[i], d**-0.5)
        torch.testing.assert_close(out[i : i + 1].double(), dense, atol=2e-5, rtol=2e-5)


def test_split_k_merges_many_partitions():
    """A long sequence cut into several partitions (8 asked; the launcher rounds partitions to
    whole tiles) next to a short one that fills only the first."""
    hq, hkv, d, bs = 4, 2, 64, 16
    lens = [520, 3]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, bs, 40, seed=3)
    q = torch.randn(2, hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention_triton(
        q, k_cache, v_cache, tables, seq_lens, d**-0.5, num_splits=8
    )
    for i in range(2):
        dense = dense_attention(q[i : i + 1], ks[i], vs[i], d**-0.5)
        torch.testing.assert_close(out[i : i + 1].double(), dense, atol=2e-5, rtol=2e-5)


def test_decode_half_precision_query():
    """float16 q and cache (the GPU dtypes): float32 accumulation keeps the error at fp16's."""
    hq, hkv, d, bs = 8, 2, 64, 16
    lens = [40, 9]
    ks, vs, k_cache, v_cache, tables = random_paged_kv(lens, hkv, d, bs, 8, seed=4)
    q = torch.randn(2, hq, d)
    args = (tables, torch.tensor(lens, dtype=torch.int32), d**-0.5)
    out = kernels.paged_decode_attention(
        q.half(), k_cache.half(), v_cache.half(), *args, backend="triton"
    )
    assert out.dtype == torch.float16
    for i in range(2):
        dense = dense_attention(q[i : i + 1], ks[i], vs[i], d**-0.5)
        torch.testing.assert_close(out[i : i + 1].double(), dense, atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize(
    "hq,hkv,d,block_size,fp8",
    [(9, 3, 64, 8, False), (4, 1, 128, 16, False), (8, 4, 64, 32, True)],
)
def test_prefill_with_cached_prefix_matches_torch_and_dense(hq, hkv, d, block_size, fp8):
    torch.manual_seed(hq + d + block_size)
    # Full prefill, short extend after a prefix, extend mid-block, a chunk longer than a tile.
    totals, news = [20, 5, 33, 75], [20, 3, 9, 70]
    k_cache, v_cache, tables, k_scale, v_scale, kd, vd = _paged(
        totals, hkv, d, block_size, 40, fp8, seed=1
    )
    q = torch.randn(sum(news), hq, d)
    starts = torch.tensor([0, 20, 23, 32, 102], dtype=torch.int32)
    seq_lens = torch.tensor(totals, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, starts, seq_lens, d**-0.5, k_scale, v_scale)
    out = kernels.paged_prefill_attention(*args, backend="triton")
    ref = kernels.paged_prefill_attention(*args, backend="torch")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    for i, (total, new) in enumerate(zip(totals, news, strict=True)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        dense = dense_attention(q[lo:hi], kd[i], vd[i], d**-0.5, causal_offset=total - new)
        torch.testing.assert_close(out[lo:hi].double(), dense, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, FP8])
def test_store_kv_matches_torch_bit_for_bit(dtype):
    hkv, d, bs = 3, 64, 8
    # Magnitudes from 1e-4 to 1e3: fp8 subnormals, normals and saturation all occur.
    k = torch.randn(12, hkv, d) * torch.logspace(-4, 3, d)
    v = torch.randn(12, hkv, d)
    if dtype == FP8:
        v[0, 0, :4] = torch.tensor([0.0, -0.0, 448.0, -1e6])  # signed zeros, max, saturation
    slots = torch.tensor([3, -1, 17, 100, 0, -1, 55, 8, 9, 127, -1, 64])
    scales = (torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 0.25, 4.0]))
    for k_scale, v_scale in [(None, None), scales] if dtype == FP8 else [(None, None)]:
        caches = {}
        for backend in ("torch", "triton"):
            k_cache = torch.full((16, bs, hkv, d), 7.0).to(dtype)
            v_cache = torch.full((16, bs, hkv, d), 7.0).to(dtype)
            kernels.store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale, backend=backend)
            caches[backend] = (k_cache, v_cache)
        for ours, ref in zip(caches["triton"], caches["torch"], strict=True):
            assert torch.equal(ours.view(torch.uint8), ref.view(torch.uint8))
        # Padding slots (-1) wrote nothing: untouched slots still hold the fill value.
        untouched = torch.ones(16 * bs, dtype=torch.bool)
        untouched[slots[slots >= 0]] = False
        assert caches["triton"][0].view(-1, hkv, d)[untouched].float().eq(7.0).all()


def test_store_kv_strided_input_and_int64_slots():
    """K/V as views into a fused qkv projection (row stride > Hkv*D), slots past 2**31 bytes."""
    hkv, d = 2, 64
    qkv = torch.randn(5, 4 * hkv * d)
    k = qkv[:, : hkv * d].view(5, hkv, d)
    v = qkv[:, hkv * d : 2 * hkv * d].view(5, hkv, d)
    k_cache = torch.zeros(4, 16, hkv, d)
    v_cache = torch.zeros(4, 16, hkv, d)
    slots = torch.tensor([63, 0, 17, 40, 5], dtype=torch.int64)
    kernels.store_kv(k, v, k_cache, v_cache, slots, backend="triton")
    torch.testing.assert_close(k_cache.view(-1, hkv, d)[slots], k)
    torch.testing.assert_close(v_cache.view(-1, hkv, d)[slots], v)


def test_per_tensor_scale_broadcasts_and_bad_scale_is_rejected():
    hq, hkv, d, bs = 4, 2, 64, 8
    ks, vs, k_cache, v_cache, tables = random_paged_kv([10], hkv, d, bs, 4)
    k8, v8 = k_cache.to(FP8), v_cache.to(FP8)
    one = torch.tensor(0.05)
    slots = torch.tensor([int(tables[0, p // bs]) * bs + p % bs for p in range(10)])
    kernels.store_kv(ks[0], vs[0], k8, v8, slots, one, one, backend="triton")
    q = torch.randn(1, hq, d)
    args = (q, k8, v8, tables, torch.tensor([10], dtype=torch.int32), d**-0.5)
    out = kernels.paged_decode_attention(*args, one, one, backend="triton")
    ref = kernels.paged_decode_attention(*args, one.expand(hkv), one.expand(hkv), backend="torch")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="KV scale has 3 values"):
        kernels.paged_decode_attention(*args, torch.ones(3), torch.ones(3), backend="triton")


def test_int64_block_addressing():
    """Block ids whose element offsets pass 2**31: int32 address arithmetic would wrap.

    Two 2 GiB fp8 pools from torch.empty: the OS backs only the pages the test touches."""
    hq, hkv, d, bs = 2, 1, 64, 16
    num_blocks = (1 << 31) // (bs * hkv * d) + 4
    k_cache = torch.empty((num_blocks, bs, hkv, d), dtype=FP8)
    v_cache = torch.empty((num_blocks, bs, hkv, d), dtype=FP8)
    table = [num_blocks - 1, num_blocks - 3]
    assert table[1] * k_cache.stride(0) >= 2**31
    n = 2 * bs
    k, v = torch.randn(n, hkv, d), torch.randn(n, hkv, d)
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
    one = torch.ones(hkv)
    kernels.store_kv(k, v, k_cache, v_cache, slots, one, one, backend="triton")
    kq, vq = k.to(FP8).float(), v.to(FP8).float()
    assert torch.equal(k_cache[table[1]].float(), kq[bs:])
    tables = torch.tensor([table], dtype=torch.int32)
    q = torch.randn(1, hq, d)
    args = (k_cache, v_cache, tables)
    out = kernels.paged_decode_attention(
        q, *args, torch.tensor([n], dtype=torch.int32), d**-0.5, one, one, backend="triton"
    )
    dense = dense_attention(q, kq, vq, d**-0.5)
    torch.testing.assert_close(out.double(), dense, atol=2e-5, rtol=2e-5)
    qs = torch.randn(n, hq, d)
    out = kernels.paged_prefill_attention(
        qs,
        *args,
        torch.tensor([0, n], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
        d**-0.5,
        one,
        one,
        backend="triton",
    )
    dense = dense_attention(qs, kq, vq, d**-0.5, causal_offset=0)
    torch.testing.assert_close(out.double(), dense, atol=2e-5, rtol=2e-5)


def test_auto_heuristic_splits_long_contexts_at_small_batch():
    assert decode_num_splits(batch=1, num_kv_heads=8, max_context=8192, num_sms=132) == 32
    assert decode_num_splits(batch=1, num_kv_heads=8, max_context=512, num_sms=132) == 1
    assert decode_num_splits(batch=64, num_kv_heads=8, max_context=8192, num_sms=132) == 1
    # Partitions never shrink below SPLIT_MIN_PARTITION tokens.
    assert decode_num_splits(batch=1, num_kv_heads=1, max_context=2048, num_sms=132) == 8


def test_backend_resolution():
    cpu = torch.zeros(1)
    assert kernels.resolve_backend("auto", cpu) == "torch"
    assert kernels.resolve_backend("torch", cpu) == "torch"
    assert kernels.resolve_backend("triton", cpu) == "triton"  # interpreter
    with pytest.raises(ValueError, match="backend"):
        kernels.resolve_backend("cuda", cpu)


@pytest.fixture(scope="module")
def tiny_llm_source(default_model, tmp_path_factory):
    """A 2-layer random Qwen3 (4 query / 2 KV heads, head dim 32): the interpreter is slow."""
    from kvscope.engine.model.loader import load_model

    folder = tmp_path_factory.mktemp("tiny") / "qwen3"
    return load_model(str(make_tiny_model("qwen3", folder, tokenizer=default_model.tokenizer)))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_engine_on_triton_kernels_matches_torch_kernels(
    tiny_llm_source, monkeypatch, kv_cache_dtype
):
    """A model end to end with every kernel call routed to Triton (interpreted): the engine's
    real strides (fused qkv views, per-layer pool views), mixed decode + prefill steps, a
    prefix-cache hit (the second call extends the first's cached prompt) and, for fp8, the
    calibration forward."""
    from kvscope.engine import LLM, SamplingParams

    shared = list(range(1000, 1040))  # 40 tokens: two full blocks of 16 get cached
    prompts = [shared + [7, 8, 9], list(range(2000, 2021))]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)

    def run(backend):
        monkeypatch.setattr(kernels, "resolve_backend", lambda requested, tensor: backend)
        llm = LLM(
            model=tiny_llm_source,
            device="cpu",
            dtype="float32",
            kv_cache_dtype=kv_cache_dtype,
            num_kv_blocks=24,
            block_size=16,
        )
        first = llm.generate([shared + [5]], params)
        second = llm.generate(prompts, params)
        assert second[0].num_cached_tokens == 32
        return [o.outputs[0].token_ids for o in first + second]

    assert run("triton") == run("torch")
