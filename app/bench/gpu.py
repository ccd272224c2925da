"""`kvscope bench --gpu`: paged-attention decode on a CUDA GPU, kernel by kernel and end to end.

Writes <out>/bench_gpu.json with two grids:
  kernel  our Triton paged decode (scattered blocks; split-K picked by its heuristic) against torch
          SDPA over the same K/V held contiguously ([B, Hkv, L, D]), batch 1..64 x context
          512..8192 on one Llama-3-8B-shaped layer (32 query / 8 KV heads, head dim 128). Per
          point: time per call, GB/s of K/V (+q/out) moved and the share of the device's peak
          bandwidth; fp8 KV as well where the GPU has it (compute capability >= 8.9).
  engine  decode tokens/s of the engine on the bundled model (16-bit KV, and fp8 KV where
          supported) against a minimal decode loop over the same weights that keeps one
          contiguous cache per layer and calls SDPA, over batch 1..64 x context 512..8192.

Kernel times are CUDA events around single calls after warmup, L2 flushed before each call,
median of the repeats. Engine steps are wall clock between device synchronizations: a step's
host-side scheduling is part of what the engine costs. The peak bandwidth comes from a table of
datasheet figures by device name, or a measured device-to-device copy where the name is unknown.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import FP8_MIN_CUDA_CAPABILITY
from engine.model.llama import LlamaModel, rms_norm
from engine.model.loader import LoadedModel, load_model
from engine.model.rope import apply_rotary

# Datasheet memory bandwidth, GB/s; the first name fragment found in the device name wins.
PEAK_BANDWIDTH_GB_S = (
    ("GH200", 4000),
    ("H200", 4800),
    ("H100 NVL", 3938),
    ("H100 PCIe", 2000),
    ("H100", 3350),
    ("H800", 3350),
    ("A100 80GB PCIe", 1935),
    ("A100-SXM4-80GB", 2039),
    ("A100", 1555),
    ("A800", 2039),
    ("L40S", 864),
    ("L40", 864),
    ("L4", 300),
    ("A10G", 600),
    ("A10", 600),
    ("RTX 6000 Ada", 960),
    ("RTX 4090", 1008),
    ("RTX 4080", 717),
    ("RTX 3090", 936),
    ("T4", 320),
    ("V100", 900),
)
L2_FLUSH_BYTES = 256 << 20


@dataclass
class GpuBenchSettings:
    out: Path = Path("bench_out")
    kernel_batches: tuple[int, ...] = (1, 4, 16, 64)
    kernel_contexts: tuple[int, ...] = (512, 2048, 8192)
    kernel_heads: tuple[int, int, int] = (32, 8, 128)  # query heads, KV heads, head dim
    kernel_iters: int = 20
    kernel_warmup: int = 3
    engine_batches: tuple[int, ...] = (1, 8, 64)
    engine_contexts: tuple[int, ...] = (512, 2048, 8192)
    decode_steps: int = 32
    warmup_steps: int = 4
    block_size: int = 16


# ---- timing -----------------------------------------------------------------------------------
def _timer(
    device: torch.device, iters: int, warmup: int
) -> Callable[[Callable[[], object]], float]:
    """Median seconds of one call: CUDA events on a GPU (L2 flushed first), perf_counter on CPU."""
    if device.type != "cuda":

        def cpu_time(fn: Callable[[], object]) -> float:
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        return cpu_time

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def cuda_time(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()  # the first call also compiles the Triton kernel
        torch.cuda.synchronize(device)
        times = []
        for _ in range(iters):
            # K/V must come from HBM, not the previous call's L2; the GPU still busy flushing
            # also hides the host's launch latency from the events (as triton's do_bench does).
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    return cuda_time


def peak_bandwidth(device: torch.device) -> dict:
    """Datasheet peak by device name, and a measured copy (read + write) for comparison."""
    name = torch.cuda.get_device_name(device)
    table = next((gb for frag, gb in PEAK_BANDWIDTH_GB_S if frag in name), None)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = _timer(device, iters=10, warmup=2)(lambda: dst.copy_(src))
    copy_gb_s = 2 * src.numel() / copy_s / 1e9
    return {
        "device_name": name,
        "datasheet_gb_s": table,
        "copy_gb_s": copy_gb_s,
        "peak_gb_s": table if table is not None else copy_gb_s,
        "peak_source": "datasheet" if table is not None else "measured device-to-device copy",
    }


# ---- correctness on the device -----------------------------------------------------------------
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
    import kernels
    from kernels import triton_kernels as tk

    fp8 = _has_fp8(device) if fp8 is None else fp8
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
        scales = ()
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
            ours = tk.paged_decode_attention_triton(*args, num_splits=n).float()
            diffs[f"decode_splits_{n}"] = float((ours - ref).abs().max())
        starts = torch.tensor([0, *itertools.accumulate(news)], dtype=torch.int32, device=device)
        q = torch.randn((sum(news), hq, d), generator=g, device=device, dtype=dtype)
        args = (q, k_cache, v_cache, tables, starts, seq_lens, d**-0.5, *scales)
        ref = kernels.paged_prefill_attention(*args, backend="torch").float()
        ours = kernels.paged_prefill_attention(*args, backend="triton").float()
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


# ---- kernel grid ------------------------------------------------------------------------------
def _sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence, q [B, Hq, D], over contiguous k/v [B, Hkv, L, D].

    The group of query heads sharing a KV head rides in SDPA's query-length axis: exact for a
    single decode token (no causal mask), and it keeps SDPA on its flash path for GQA models."""
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), k, v, scale=scale)
    return out.reshape(b, hq, d)


def kernel_point(
    batch: int,
    context: int,
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    timer: Callable[[Callable[[], object]], float],
    device: torch.device,
    backend: str = "triton",
) -> dict:
    """One decode call over `batch` sequences of `context` tokens in scattered blocks, timed for
    our kernel (and with split-K off where the heuristic turns it on) and, for a 16-bit cache,
    torch SDPA over the same K/V laid out contiguously."""
    import kernels
    from kernels import triton_kernels as tk

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
    scales = (torch.ones(hkv, device=device), torch.ones(hkv, device=device)) if fp8 else ()
    args = (q, k_cache, v_cache, tables, seq_lens, d**-0.5, *scales)
    splits = tk.decode_num_splits(batch, hkv, per_seq * block_size, tk.device_sm_count(device))

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
        no_split_s = timer(lambda: tk.paged_decode_attention_triton(*args, num_splits=1))
        point["ours_no_split_us"] = 1e6 * no_split_s
    if not fp8:
        order = tables.long().view(-1)
        k = k_cache.index_select(0, order).view(batch, -1, hkv, d)[:, :context]
        v = v_cache.index_select(0, order).view(batch, -1, hkv, d)[:, :context]
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

        def sdpa() -> torch.Tensor:
            return _sdpa_decode(q, k, v, d**-0.5)

        sdpa_s = timer(sdpa)
        point["sdpa_us"] = 1e6 * sdpa_s
        point["sdpa_gb_s"] = moved / sdpa_s / 1e9
        point["max_abs_diff_vs_sdpa"] = float((ours.float() - sdpa().float()).abs().max())
    return point


def kernel_grid(settings: GpuBenchSettings, device: torch.device, peak_gb_s: float) -> list[dict]:
    timer = _timer(device, settings.kernel_iters, settings.kernel_warmup)
    dtype = _half_dtype(device)
    kv_dtypes = [dtype] + ([torch.float8_e4m3fn] if _has_fp8(device) else [])
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
                _release(device)
    return points


# ---- engine grid ------------------------------------------------------------------------------
def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts: shared ones would share blocks (and L2) and flatter decode."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (batch, length), generator=g).tolist()


def engine_decode_point(llm: LLM, prompts: list[list[int]], steps: int, warmup_steps: int) -> dict:
    """Prefill every prompt untimed, then time `steps` decode steps over the whole batch."""
    engine = llm.engine
    device = engine.model.device
    params = SamplingParams(max_tokens=warmup_steps + steps + 2, temperature=0.0, ignore_eos=True)
    ids = [f"gpu-bench-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    try:
        started: set[str] = set()
        while len(started) < len(ids):  # chunked prefill; decodes of early finishers run along
            started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
        for _ in range(warmup_steps):
            engine.step()
        step_s = []
        for _ in range(steps):
            _sync(device)
            start = time.perf_counter()
            engine.step()
            _sync(device)
            step_s.append(time.perf_counter() - start)
    finally:
        for rid in ids:
            engine.abort_request(rid)
    median = statistics.median(step_s)
    return {"step_ms": 1e3 * median, "tokens_per_s": len(prompts) / median}


class ContiguousSdpaDecoder:
    """The baseline: the engine model's weights and math, but each layer's K/V in one contiguous
    [B, Hkv, max_len, D] tensor and attention by torch SDPA (no blocks, no tables)."""

    def __init__(self, model: LlamaModel, batch: int, max_len: int) -> None:
        cfg = model.cfg
        self.model = model
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, rows: slice = slice(None)) -> torch.Tensor:
        """ids [b, T] at positions start..start+T-1 for cache rows `rows`; last-token logits."""
        m, cfg = self.model, self.model.cfg
        b, t = ids.shape
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        positions = torch.arange(start, start + t, device=ids.device).repeat(b)
        cos, sin = m.rope.cos_sin(positions)
        h = m.embed(ids.reshape(-1))
        for i, layer in enumerate(m.layers):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = layer.qkv(x)
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k, v = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
            if layer.q_norm is not None:
                q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
            q, k = apply_rotary(q, k, cos, sin)
            self.k[i, rows, :, start : start + t] = k.view(b, t, hkv, d).transpose(1, 2)
            self.v[i, rows, :, start : start + t] = v.view(b, t, hkv, d).transpose(1, 2)
            keys, values = self.k[i, rows, :, : start + t], self.v[i, rows, :, : start + t]
            if t == 1:
                # Decode: a KV head's query heads become its queries (plain MHA over Hkv heads),
                # so SDPA reads each K/V once on its fastest path, with no GQA support needed.
                attn = _sdpa_decode(q.view(b, hq, d), keys, values, layer.scale)
            else:  # a prompt from position 0 (untimed): heads repeated, causal
                attn = F.scaled_dot_product_attention(
                    q.view(b, t, hq, d).transpose(1, 2),
                    keys.repeat_interleave(hq // hkv, dim=1),
                    values.repeat_interleave(hq // hkv, dim=1),
                    is_causal=True,
                    scale=layer.scale,
                ).transpose(1, 2)
            h = h + layer.o_proj(attn.reshape(b * t, hq * d))
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        last = h.view(b, t, -1)[:, -1]
        return m.compute_logits(rms_norm(last, m.norm, cfg.rms_norm_eps))


def sdpa_decode_point(
    model: LlamaModel, prompts: list[list[int]], steps: int, warmup_steps: int
) -> dict:
    """The contiguous-cache baseline over the same prompts: prefill untimed, greedy decode timed."""
    device = model.device
    batch, length = len(prompts), len(prompts[0])
    decoder = ContiguousSdpaDecoder(model, batch, length + warmup_steps + steps + 1)
    ids = torch.tensor(prompts, device=device)
    rows_per_chunk = max(1, 16384 // length)  # bounds prefill activations on smaller GPUs
    chunks = []
    for lo in range(0, batch, rows_per_chunk):
        rows = slice(lo, min(batch, lo + rows_per_chunk))
        chunks.append(decoder.forward(ids[rows], 0, rows))
    token = torch.cat(chunks).argmax(-1, keepdim=True)
    pos = length
    for _ in range(warmup_steps):
        token = decoder.forward(token, pos).argmax(-1, keepdim=True)
        pos += 1
    step_s = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        token = decoder.forward(token, pos).argmax(-1, keepdim=True)
        token.tolist()  # the engine hands tokens to the host every step too
        step_s.append(time.perf_counter() - start)
        pos += 1
    median = statistics.median(step_s)
    return {"step_ms": 1e3 * median, "tokens_per_s": batch / median}


def engine_grid(settings: GpuBenchSettings, loaded: LoadedModel, device: torch.device) -> dict:
    """Decode tokens/s per (batch, context) for each contender; contexts past the model's window
    are cut to fit (the point records the prompt length used)."""
    mc = loaded.config
    room = settings.warmup_steps + settings.decode_steps + 2
    max_len = mc.max_position_embeddings
    lengths = sorted({min(c, max_len - room) for c in settings.engine_contexts})
    batches = settings.engine_batches
    bs = settings.block_size
    blocks = max(batches) * math.ceil((max(lengths) + room) / bs) + max(batches)
    kv_dtypes = ["auto"] + (["fp8"] if _has_fp8(device) else [])
    rows: dict[str, list[dict]] = {}
    for kv in kv_dtypes:
        llm = LLM(
            model=loaded,
            device=str(device),
            kv_cache_dtype=kv,
            block_size=bs,
            num_kv_blocks=blocks,
            max_num_seqs=max(batches),
            enable_prefix_caching=False,
        )
        name = f"engine_kv_{kv if kv == 'fp8' else 'model_dtype'}"

        def engine_point(prompts: list[list[int]], llm: LLM = llm) -> dict:
            return engine_decode_point(llm, prompts, settings.decode_steps, settings.warmup_steps)

        rows[name] = _grid(engine_point, batches, lengths, mc.vocab_size)
        model = llm.engine.model  # the same weights serve the baseline below
        del llm, engine_point
        _release(device)  # the pool goes before the next contender allocates its own

    def sdpa_point(prompts: list[list[int]]) -> dict:
        return sdpa_decode_point(model, prompts, settings.decode_steps, settings.warmup_steps)

    rows["sdpa_contiguous"] = _grid(sdpa_point, batches, lengths, mc.vocab_size)
    return rows


def _grid(run: Callable[[list[list[int]]], dict], batches, lengths, vocab) -> list[dict]:
    points = []
    for batch in batches:
        for length in lengths:
            point = {"batch": batch, "prompt_tokens": length}
            try:
                point |= run(_prompts(batch, length, vocab, seed=batch * 7919 + length))
            except torch.cuda.OutOfMemoryError as e:
                point["error"] = f"out of memory: {e}".splitlines()[0]
                _release(torch.device("cuda"))
            points.append(point)
    return points


# ---- entry ------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _half_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def _has_fp8(device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device) >= FP8_MIN_CUDA_CAPABILITY
    )


def gpu_unavailable_reason() -> str | None:
    """Why `--gpu` cannot run here (None when it can)."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"kvscope bench --gpu needs an NVIDIA GPU, and torch {torch.__version__} ({build}) "
            "sees none. `kvscope bench` without --gpu runs the CPU benchmark."
        )
    if importlib.util.find_spec("triton") is None:
        return "kvscope bench --gpu needs the triton package: `pip install triton`."
    return None


def gpu_benchmark(settings: GpuBenchSettings, loaded: LoadedModel | None = None) -> dict:
    started = time.perf_counter()
    device = torch.device("cuda")
    checks = kernel_checks(device, [torch.float32, _half_dtype(device)])
    peak = peak_bandwidth(device)
    kernel = kernel_grid(settings, device, peak["peak_gb_s"])
    loaded = loaded or load_model(None)
    engine = engine_grid(settings, loaded, device)
    props = torch.cuda.get_device_properties(device)
    report = {
        "device": peak
        | {
            "capability": list(torch.cuda.get_device_capability(device)),
            "sms": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "triton_version": importlib.import_module("triton").__version__,
        },
        "model": {"name": Path(loaded.source).name, "dtype": str(_half_dtype(device))},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "checks": checks,
        "kernel": kernel,
        "engine": engine,
        "runtime_s": time.perf_counter() - started,
    }
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "bench_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def summarize_gpu(report: dict) -> str:
    dev = report["device"]
    lines = [
        f"KVScope GPU bench: {dev['device_name']}, peak {dev['peak_gb_s']:.0f} GB/s "
        f"({dev['peak_source']}; copy measured {dev['copy_gb_s']:.0f} GB/s)",
    ]
    for c in report["checks"]:
        verdict = "ok" if c["ok"] else "FAILED"
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in c["max_abs_diff"].items())
        lines.append(
            f"  check {verdict}: Triton vs torch, heads {c['heads']}, {c['dtype']} q, "
            f"{c['kv_dtype']} KV: store bit-exact {c['store_bit_exact']}; max |diff| {diffs}"
        )
    lines.append(
        "  decode kernel (us, % of peak bandwidth): batch x context, ours vs SDPA contiguous"
    )
    for p in report["kernel"]:
        sdpa = ""
        if "sdpa_us" in p:
            sdpa = f"  sdpa {p['sdpa_us']:8.1f} ({p['sdpa_pct_of_peak']:3.0f}%)"
        lines.append(
            f"    {p['kv_dtype']:>13} {p['batch']:3d} x {p['context']:5d}: "
            f"ours {p['ours_us']:8.1f} ({p['ours_pct_of_peak']:3.0f}%, "
            f"splits {p['num_splits']}){sdpa}"
        )
    lines.append("  engine decode tokens/s: batch x prompt tokens")
    for name, points in report["engine"].items():
        cells = ", ".join(
            f"{p['batch']}x{p['prompt_tokens']} "
            + (f"{p['tokens_per_s']:.0f}" if "tokens_per_s" in p else p["error"])
            for p in points
        )
        lines.append(f"    {name}: {cells}")
    lines.append(f"  runtime {report['runtime_s']:.0f} s")
    return "\n".join(lines)


def run_gpu_bench(args) -> int:
    """CLI entry for `kvscope bench --gpu`: a clear message and rc 2 where there is no GPU."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    settings = GpuBenchSettings(out=Path(args.out))
    report = gpu_benchmark(settings)
    print(summarize_gpu(report))
    print(f"  wrote {settings.out / 'bench_gpu.json'}")
    return 0 if all(c["ok"] for c in report["checks"]) else 1
