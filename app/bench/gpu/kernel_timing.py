"""The kernel half of `kvscope bench --gpu`: our paged decode kernel against torch SDPA.

Before any timing, `kernel_checks` compares the compiled Triton kernels with the torch reference
on the device. `kernel_grid` then times our Triton paged decode (scattered blocks; split-K picked
by its heuristic) against SDPA over the same K/V held contiguously ([B, Hkv, L, D]), batch x
context on one Llama-3-8B-shaped layer by default. Per point: time per call, GB/s of K/V (+q/out)
moved and the share of the device's peak bandwidth; fp8 KV as well where the GPU has it.

Everything goes through the public kernels with an explicit backend, except split-K, which only
`engine.bench.decode_split` reaches.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from kvscope import kernels
from kvscope.app.bench.gpu.device import Timer, call_timer, half_dtype, has_fp8, release
from kvscope.engine.bench.contiguous_sdpa import sdpa_decode
from kvscope.engine.bench.decode_split import decode_with_splits, heuristic_num_splits

if TYPE_CHECKING:
    from kvscope.app.bench.gpu.settings import GpuBenchSettings

CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def kernel_checks(
    device: torch.device,
    dtypes: list[torch.dtype],
    shapes: tuple[tuple[int, int, int], ...] = ((9, 3, 64), (32, 8, 128)),
    lens: tuple[int, ...] = (1, 37, 300, 2100),
    news: tuple[int, ...] = (1, 5, 64, 100),
    fp8: bool | None = None,
) -> list[dict]:
    """Compiled Triton kernels against the torch reference on this device, before any timing:
    store (bit for bit), decode (split-K off and on) and prefill of `news` tokens after cached
    prefixes, for the bundled model's head layout and a Llama-3-8B one, 16-bit and fp8 caches
    (fp8 where the device has it, unless `fp8` says otherwise)."""
    fp8 = has_fp8(device) if fp8 is None else fp8
    kv_dtypes = [None, torch.float8_e4m3fn] if fp8 else [None]  # None: the query's dtype
    g = torch.Generator(device=device).manual_seed(0)
    bs = 16
    per_seq = -(-max(lens) // bs)
    num_blocks = len(lens) * per_seq + 1
    checks = []
    for (hq, hkv, d), dtype, kv_dtype in itertools.product(shapes, dtypes, kv_dtypes):
        kv_dtype = kv_dtype or dtype
        tables = torch.randperm(num_blocks, generator=g, device=device)[: len(lens) * per_seq]
        tables = tables.view(len(lens), per_seq).to(torch.int32)
        # (k_scale, v_scale): None, as the kernels' defaults, for a 16-bit cache
        scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        if kv_dtype == torch.float8_e4m3fn:
            scales = (torch.rand(hkv, generator=g, device=device) * 0.02 + 0.01,) * 2
        caches = {
            backend: (
                torch.zeros((num_blocks, bs, hkv, d), dtype=kv_dtype, device=device),
                torch.zeros((num_blocks, bs, hkv, d), dtype=kv_dtype, device=device),
            )
            for backend in ("torch", "triton")
        }
        for i, n in enumerate(lens):
            k = torch.randn((n, hkv, d), generator=g, device=device, dtype=dtype)
            v = torch.randn((n, hkv, d), generator=g, device=device, dtype=dtype)
            pos = torch.arange(n, device=device)
            slots = tables[i, pos // bs].long() * bs + pos % bs
            for backend, (k_cache, v_cache) in caches.items():
                kernels.store_kv(k, v, k_cache, v_cache, slots, *scales, backend=backend)
        same_bits = all(
            torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in zip(caches["triton"], caches["torch"], strict=True)
        )
        k_cache, v_cache = caches["torch"]
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        q = torch.randn((len(lens), hq, d), generator=g, device=device, dtype=dtype)
        args = (q, k_cache, v_cache, tables, seq_lens, d**-0.5, *scales)
        ref = kernels.paged_decode_attention(*args, backend="torch").float()
        diffs = {}
        for n in (1, 4):
            ours = decode_with_splits(*args, num_splits=n).float()
            diffs[f"decode_splits_{n}"] = float((ours - ref).abs().max())
        starts = torch.tensor([0, *itertools.accumulate(news)], dtype=torch.int32, device=device)
        q = torch.randn((sum(news), hq, d), generator=g, device=device, dtype=dtype)
        prefill_args = (q, k_cache, v_cache, tables, starts, seq_lens, d**-0.5, *scales)
        ref = kernels.paged_prefill_attention(*prefill_args, backend="torch").float()
        ours = kernels.paged_prefill_attention(*prefill_args, backend="triton").float()
        diffs["prefill"] = float((ours - ref).abs().max())
        tolerance = CHECK_TOLERANCE[dtype]
        checks.append(
            {
                "heads": [hq, hkv, d],
                "dtype": str(dtype).removeprefix("torch."),
                "kv_dtype": str(kv_dtype).removeprefix("torch."),
                "store_bit_exact": same_bits,
                "max_abs_diff": diffs,
                "tolerance": tolerance,
                "ok": same_bits and all(x <= tolerance for x in diffs.values()),
            }
        )
    return checks


def kernel_point(
    batch: int,
    context: int,
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    timer: Timer,
    device: torch.device,
    backend: str = "triton",
) -> dict:
    """One decode call over `batch` sequences of `context` tokens in scattered blocks, timed for
    our kernel (and with split-K off where the heuristic turns it on) and, for a 16-bit cache,
    torch SDPA over the same K/V laid out contiguously."""
    hq, hkv, d = heads
    g = torch.Generator(device=device).manual_seed(batch * 100_003 + context)
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    fp8 = kv_dtype == torch.float8_e4m3fn
    # Scattered: a random permutation of the pool, as a long-running engine's tables look.
    tables = torch.randperm(num_blocks, generator=g, device=device)
    tables = tables.view(batch, per_seq).to(torch.int32)
    shape = (num_blocks, block_size, hkv, d)
    k_cache = torch.randn(shape, generator=g, device=device, dtype=dtype).to(kv_dtype)
    v_cache = torch.randn(shape, generator=g, device=device, dtype=dtype).to(kv_dtype)
    q = torch.randn((batch, hq, d), generator=g, device=device, dtype=dtype)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # the kernels' defaults
    if fp8:
        scales = (torch.ones(hkv, device=device), torch.ones(hkv, device=device))
    args = (q, k_cache, v_cache, tables, seq_lens, d**-0.5, *scales)
    splits = heuristic_num_splits(batch, hkv, per_seq * block_size, device)

    ours = kernels.paged_decode_attention(*args, backend=backend)
    ours_s = timer(lambda: kernels.paged_decode_attention(*args, backend=backend))
    kv_bytes = 2 * batch * context * hkv * d * k_cache.element_size()
    moved = kv_bytes + 2 * q.numel() * q.element_size()
    point = {
        "batch": batch,
        "context": context,
        "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "num_splits": splits,
        "ours_us": 1e6 * ours_s,
        "ours_gb_s": moved / ours_s / 1e9,
        "bytes_moved": moved,
    }
    if splits > 1:
        no_split_s = timer(lambda: decode_with_splits(*args, num_splits=1))
        point["ours_no_split_us"] = 1e6 * no_split_s
    if not fp8:
        order = tables.long().view(-1)
        k = k_cache.index_select(0, order).view(batch, -1, hkv, d)[:, :context]
        v = v_cache.index_select(0, order).view(batch, -1, hkv, d)[:, :context]
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

        def sdpa() -> torch.Tensor:
            return sdpa_decode(q, k, v, d**-0.5)

        sdpa_s = timer(sdpa)
        point["sdpa_us"] = 1e6 * sdpa_s
        point["sdpa_gb_s"] = moved / sdpa_s / 1e9
        point["max_abs_diff_vs_sdpa"] = float((ours.float() - sdpa().float()).abs().max())
    return point


def kernel_grid(settings: GpuBenchSettings, device: torch.device, peak_gb_s: float) -> list[dict]:
    """Every (KV dtype, batch, context) point of the settings, with its share of the peak."""
    timer = call_timer(device, settings.kernel_iters, settings.kernel_warmup)
    dtype = half_dtype(device)
    kv_dtypes = [dtype] + ([torch.float8_e4m3fn] if has_fp8(device) else [])
    points = []
    for kv_dtype in kv_dtypes:
        for batch in settings.kernel_batches:
            for context in settings.kernel_contexts:
                p = kernel_point(
                    batch,
                    context,
                    settings.kernel_heads,
                    settings.block_size,
                    dtype,
                    kv_dtype,
                    timer,
                    device,
                )
                p["ours_pct_of_peak"] = 100 * p["ours_gb_s"] / peak_gb_s
                if "sdpa_gb_s" in p:
                    p["sdpa_pct_of_peak"] = 100 * p["sdpa_gb_s"] / peak_gb_s
                points.append(p)
                release(device)
    return points
