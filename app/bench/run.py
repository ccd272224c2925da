"""`kvscope bench`: run every contender on the same requests, write bench.json + bench.png."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.app.bench.allocator_bench import compare_allocators
from kvscope.app.bench.engine_bench import DecodeTiming, measure_engine_decode, run_engine_workload
from kvscope.app.bench.hf_baseline import (
    HFRunResult,
    load_hf_model,
    measure_hf_decode,
    run_hf_batched,
)
from kvscope.app.bench.machine import ContentionMeter, machine_info
from kvscope.app.bench.plot import plot_bench
from kvscope.app.bench.roofline import decode_roofline, measure_read_bandwidth
from kvscope.app.bench.sharing_bench import measure_fork_blocks, measure_prefix_ttft
from kvscope.app.bench.structured_bench import FREE_REQUESTS_TARGET, measure_structured
from kvscope.app.bench.structured_bench import THROUGHPUT_TARGET as STRUCTURED_TARGET
from kvscope.app.bench.workload import load_chat_workload
from kvscope.app.core.defaults import default_max_model_len
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.loader import LoadedModel, load_model

if TYPE_CHECKING:
    from kvscope.app.bench.hf_baseline import CausalLM

THROUGHPUT_TARGET = 2.0  # our useful tokens/s over HF's static batch, both float32
# The engine as a user runs it (dtype and quantization "auto": the GGUF's weights kept quantized,
# bfloat16 with numba's int8 kernels on a CPU) over the same HF baseline.
QUANTIZED_THROUGHPUT_TARGET = 3.0
ROOFLINE_TARGET = 0.6  # our batch-1 decode tokens/s over the bandwidth roofline
CONTENDED = 0.1  # a phase whose CPU stall share exceeds this gets a warning


@dataclass
class BenchSettings:
    out: Path = Path("bench_out")
    workload: Path | None = None  # None: the bundled chat_mixed.json
    num_requests: int | None = None  # None: every request in the workload
    max_tokens_cap: int | None = None
    hf_batch_size: int | None = None  # None: all requests in one static batch
    hf_sequential: int = 4  # requests the one-at-a-time baseline runs (it is the slowest)
    decode_steps: int = 64
    skip_hf: bool = False
    skip_sharing: bool = False
    skip_allocators: bool = False
    skip_structured: bool = False
    bandwidth_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.decode_steps < 2:
            raise ValueError(f"decode_steps must be >= 2, got {self.decode_steps}")
        if self.hf_sequential < 0:
            raise ValueError(f"hf_sequential must be >= 0, got {self.hf_sequential}")
        if self.hf_batch_size is not None and self.hf_batch_size < 1:
            raise ValueError(f"hf_batch_size must be >= 1, got {self.hf_batch_size}")


def run_bench(args: argparse.Namespace) -> int:
    """CLI entry: settings from `kvscope bench` flags; prints a summary."""
    if getattr(args, "gpu", False):
        from kvscope.app.bench.gpu.bench import run_gpu_bench

        return run_gpu_bench(args)
    if getattr(args, "threads", False):
        from kvscope.app.bench.threads_bench import run_threads_bench, summarize_threads

        print(summarize_threads(run_threads_bench(Path(args.out))))
        print(f"  wrote {Path(args.out) / 'bench_threads.json'} and bench_threads.png")
        return 0
    if getattr(args, "peer", None) and getattr(args, "models", False):
        from kvscope.app.bench.llama_cpp.peer_models import run_peer_models_cli

        return run_peer_models_cli(args)
    if getattr(args, "peer", None):
        from kvscope.app.bench.llama_cpp.peer_bench import run_peer_bench, summarize_peer

        report = run_peer_bench(Path(args.out), args.peer, threads=args.num_threads)
        print(summarize_peer(report))
        print(f"  wrote {Path(args.out) / 'bench_peer.json'} and bench_peer.png")
        return 0
    if getattr(args, "sliding", False):
        from kvscope.app.bench.sliding_bench import run_and_plot, summarize_sliding
        from kvscope.app.core.paths import cache_dir

        out = Path(args.out)
        report = run_and_plot(out, cache_dir() / "bench-sliding", args.sliding_tokens)
        print(summarize_sliding(report))
        print(f"  wrote {out / 'bench_sliding.json'} and bench_sliding.png")
        return 0
    if getattr(args, "whatif", False):
        from kvscope.app.bench.whatif_bench import run_whatif_bench, summarize_whatif

        report = run_whatif_bench(Path(args.out))
        print(summarize_whatif(report))
        print(f"  wrote {Path(args.out) / 'bench_whatif.json'} and bench_whatif.png")
        return 0
    if getattr(args, "mixed", False):
        from kvscope.app.bench.mixed_step_bench import run_mixed_bench, summarize_mixed

        print(summarize_mixed(run_mixed_bench(Path(args.out))))
        print(f"  wrote {Path(args.out) / 'bench_mixed.json'}")
        return 0
    if getattr(args, "download", False):
        from kvscope.app.bench.download_bench import run_download_bench, summarize_download

        print(summarize_download(run_download_bench(Path(args.out))))
        print(f"  wrote {Path(args.out) / 'bench_download.json'}")
        return 0
    if getattr(args, "soak", None) is not None:
        from kvscope.app.bench.soak.bench import run_soak_bench

        return run_soak_bench(args)
    if getattr(args, "serve", False) and getattr(args, "peer_server", None):
        from kvscope.app.bench.serving.peer import run_serve_peer

        return run_serve_peer(args)
    if getattr(args, "serve", False):
        from kvscope.app.bench.serving.bench import run_serve_bench

        return run_serve_bench(args)
    if getattr(args, "models", False):
        from kvscope.app.bench.models.bench import run_models_bench
        from kvscope.app.core.paths import cache_dir

        run_models_bench(Path(args.out), cache_dir() / "bench-models")
        print(f"  wrote {Path(args.out) / 'bench_models.json'} and bench_models.png")
        return 0
    settings = BenchSettings(
        out=Path(args.out),
        workload=Path(args.workload) if args.workload else None,
        num_requests=args.num_requests,
        max_tokens_cap=args.max_tokens_cap,
        hf_batch_size=args.hf_batch_size,
        hf_sequential=args.hf_sequential,
        decode_steps=args.decode_steps,
        skip_hf=args.skip_hf,
        skip_sharing=args.skip_sharing,
        skip_allocators=args.skip_allocators,
        skip_structured=args.skip_structured,
    )
    try:  # a bad workload file is the user's to fix: its reason, not a traceback
        load_chat_workload(settings.workload, settings.num_requests, settings.max_tokens_cap)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = benchmark(settings)
    print(summarize(report))
    print(f"  wrote {settings.out / 'bench.json'} and {settings.out / 'bench.png'}")
    return 0


def benchmark(
    settings: BenchSettings,
    loaded: LoadedModel | None = None,
    hf_model: CausalLM | None = None,
) -> dict:
    """Run the bench and write `<out>/bench.json` and `<out>/bench.png`; returns the report.

    Pass an already loaded model (and HF model) to skip reading the weights again, as tests do.
    """
    started = time.perf_counter()
    info = machine_info()
    meter = ContentionMeter()
    requests = load_chat_workload(settings.workload, settings.num_requests, settings.max_tokens_cap)
    loaded = loaded or load_model(None)
    # The bench compares like with like: float32 on the CPU for every contender.
    # float32 as a user gets it with dtype="float32" and the default quantization: the GGUF
    # dequantized once at load where it fits (engine/sizing/float32_weights.py), the same numbers HF
    # transformers computes with, a like-for-like race. Its layout is reported with its rate.
    # The product's context, as the app, `serve` and `record` run this model.
    context = default_max_model_len(loaded.config.max_position_embeddings)
    llm = LLM(model=loaded, device="cpu", dtype="float32", max_model_len=context)
    engine = llm.engine
    prompts = [engine.tokenize(engine.apply_chat_template(r.messages))[1] for r in requests]
    max_tokens = [r.max_tokens for r in requests]

    llm.generate([prompts[0]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    with meter.phase("ours_workload"):
        ours = run_engine_workload(llm, prompts, max_tokens)
    with meter.phase("ours_decode"):
        ours_decode = measure_engine_decode(llm, prompts[0], settings.decode_steps)
    f32_stats = llm.stats()
    weight_bytes, kv_dtype = f32_stats["weight_bytes"], llm.config.kv_torch_dtype
    eos_ids = set(engine.eos_token_ids)  # the stop set both engines and HF use
    del llm, engine  # its float32 weights, before the quantized engine is built
    # The defaults a user gets, from the file (`loaded` may hold dequantized weights).
    quantized = LLM(model=loaded.source, device="cpu", max_model_len=context)
    q_stats = quantized.stats()
    quantized.generate([prompts[0]], SamplingParams(max_tokens=2, temperature=0.0))
    with meter.phase("ours_quantized_workload"):
        ours_q = run_engine_workload(quantized, prompts, max_tokens)
    with meter.phase("ours_quantized_decode"):
        ours_q_decode = measure_engine_decode(quantized, prompts[0], settings.decode_steps)
    structured = None
    if not settings.skip_structured:
        with meter.phase("structured"):
            structured = measure_structured(quantized, prompts)
    del quantized
    hf_static = hf_sequential = hf_decode = None
    if not settings.skip_hf:
        pad_id = loaded.tokenizer.pad_token_id
        hf_static, hf_sequential, hf_decode = _run_hf(
            settings,
            meter,
            hf_model or load_hf_model(),
            prompts,
            max_tokens,
            eos_ids=eos_ids,
            pad_id=min(eos_ids) if pad_id is None else pad_id,
        )
    sharing = None
    if not settings.skip_sharing:
        with meter.phase("sharing"):
            sharing = {
                "prefix_cache_ttft": measure_prefix_ttft(loaded, settings.workload),
                "fork_peak_blocks": measure_fork_blocks(loaded, settings.workload),
            }
    allocators = None
    if not settings.skip_allocators:
        with meter.phase("allocators"):
            allocators = compare_allocators(loaded, prompts, max_tokens)
    with meter.phase("bandwidth"):
        bandwidth = measure_read_bandwidth(settings.bandwidth_bytes)
    # K and V of every layer over the whole context: what one decode step's attention reads.
    kv_token_bytes = loaded.config.kv_bytes_per_token(kv_dtype.itemsize)
    kv_bytes = kv_token_bytes * ours_decode.mean_context_tokens
    roofline = decode_roofline(bandwidth, weight_bytes, kv_bytes)
    q_kv_bytes = loaded.config.kv_bytes_per_token(2) * ours_q_decode.mean_context_tokens
    q_roofline = decode_roofline(bandwidth, q_stats["weight_bytes"], q_kv_bytes)

    hf_rate = hf_static.useful_tokens_per_s if hf_static else None
    speedup = ours.useful_tokens_per_s / hf_rate if hf_rate else None
    q_speedup = ours_q.useful_tokens_per_s / hf_rate if hf_rate else None
    roofline_share = ours_decode.tokens_per_s / roofline.tokens_per_s
    targets = {
        "useful_throughput_vs_hf_static": _target(speedup, THROUGHPUT_TARGET),
        "useful_throughput_quantized_vs_hf_static": _target(q_speedup, QUANTIZED_THROUGHPUT_TARGET),
        "decode_batch1_vs_roofline": _target(roofline_share, ROOFLINE_TARGET),
    }
    if structured is not None:  # skipped: no target, rather than one with no ratio
        targets["structured_half_vs_unconstrained"] = _target(
            structured["mixed_over_unconstrained"], STRUCTURED_TARGET
        )
        targets["structured_free_requests_beside_constrained"] = _target(
            structured["free_requests_ratio"], FREE_REQUESTS_TARGET
        )
    report = {
        "machine": info | {"cpu_stall_share": meter.stall_share},
        "model": {"name": Path(loaded.source).name, "source": loaded.source, "dtype": "float32"},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "workload": {
            "num_requests": len(prompts),
            "prompt_tokens": sum(len(p) for p in prompts),
            "max_tokens_total": sum(max_tokens),
        },
        "ours": asdict(ours)
        | {k: f32_stats[k] for k in ("weight_format", "weight_layout", "weight_choice")},
        "ours_quantized": asdict(ours_q)
        | {k: q_stats[k] for k in ("dtype", "weight_format", "weight_layout")},
        "hf_static": asdict(hf_static) if hf_static else None,
        "hf_sequential": asdict(hf_sequential) if hf_sequential else None,
        "decode_batch1": {
            "steps": settings.decode_steps,
            "context_tokens_mean": ours_decode.mean_context_tokens,
            "roofline": asdict(roofline),
            "ours_tokens_per_s": ours_decode.tokens_per_s,
            "ours_mean_tokens_per_s": ours_decode.mean_tokens_per_s,
            "ours_pct_of_roofline": 100 * roofline_share,
            "hf_tokens_per_s": hf_decode.tokens_per_s if hf_decode else None,
            "hf_mean_tokens_per_s": hf_decode.mean_tokens_per_s if hf_decode else None,
            "ours_quantized_tokens_per_s": ours_q_decode.tokens_per_s,
            "quantized_roofline": asdict(q_roofline),
            "ours_quantized_pct_of_roofline": 100
            * ours_q_decode.tokens_per_s
            / q_roofline.tokens_per_s,
        },
        "sharing": sharing,
        "allocators": allocators,
        "structured": structured,
        "targets": targets,
        "runtime_s": time.perf_counter() - started,
    }
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_bench(report, settings.out / "bench.png")
    return report


def _run_hf(
    settings: BenchSettings,
    meter: ContentionMeter,
    model: CausalLM,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_ids: set[int],
    pad_id: int,
) -> tuple[HFRunResult, HFRunResult | None, DecodeTiming]:
    """HF static batch, HF one request at a time (a prefix of the workload), HF batch-1 decode."""
    run_hf_batched(model, [prompts[0]], [2], eos_ids, pad_id, 1)  # warm-up
    batch_size = settings.hf_batch_size or len(prompts)
    with meter.phase("hf_static"):
        static = run_hf_batched(model, prompts, max_tokens, eos_ids, pad_id, batch_size)
    sequential = None
    if settings.hf_sequential:
        n = min(settings.hf_sequential, len(prompts))
        with meter.phase("hf_sequential"):
            sequential = run_hf_batched(model, prompts[:n], max_tokens[:n], eos_ids, pad_id, 1)
    with meter.phase("hf_decode"):
        decode = measure_hf_decode(model, prompts[0], settings.decode_steps, eos_ids, pad_id)
    return static, sequential, decode


def _target(ratio: float | None, target: float) -> dict:
    return {"ratio": ratio, "target": target, "met": None if ratio is None else ratio >= target}


def summarize(report: dict) -> str:
    """A few lines for the terminal; bench.json has every figure."""
    ours, static, seq = report["ours"], report["hf_static"], report["hf_sequential"]
    d, m, r = report["decode_batch1"], report["machine"], report["decode_batch1"]["roofline"]
    lines = [
        f"KVScope bench: {report['model']['name']}, CPU ({m['cpu_count']} cores), "
        f"{report['workload']['num_requests']} chat requests",
        f"  ours, float32 {ours['useful_tokens_per_s']:5.1f} useful tok/s  "
        f"({ours['useful_tokens']} tokens in {ours['wall_s']:.1f} s; TTFT mean "
        f"{ours['ttft_mean_s']:.2f} s, p50 {ours['ttft_p50_s']:.2f}, p90 {ours['ttft_p90_s']:.2f}; "
        f"peak running {ours['peak_num_running']}, preemptions {ours['num_preemptions']}; "
        f"weights {ours.get('weight_format', '?')}, {ours.get('weight_layout', '?')})",
    ]
    q = report["ours_quantized"]
    lines.append(
        f"  ours, auto    {q['useful_tokens_per_s']:5.1f} useful tok/s  "
        f"({q['dtype']}, {q['weight_format']} kept, {q['weight_layout']}; "
        f"{q['wall_s']:.1f} s; TTFT mean {q['ttft_mean_s']:.2f} s)"
    )
    if static:
        lines.append(
            f"  HF static   {static['useful_tokens_per_s']:7.1f} useful tok/s  "
            f"({static['useful_tokens']} useful of {static['generated_slots']} generated, "
            f"{100 * static['wasted_token_share']:.0f}% wasted, {static['wall_s']:.1f} s)"
        )
    if seq:
        lines.append(
            f"  HF 1-by-1   {seq['useful_tokens_per_s']:7.1f} useful tok/s  "
            f"({seq['num_requests']} requests, {seq['wall_s']:.1f} s)"
        )
    hf_b1 = f", HF {d['hf_tokens_per_s']:.1f}" if d["hf_tokens_per_s"] is not None else ""
    lines.append(
        f"  batch-1 decode: roofline {r['tokens_per_s']:.1f} tok/s ({r['bandwidth_gb_s']:.1f} GB/s "
        f"/ {r['bytes_per_token'] / 1e6:.0f} MB per token), ours {d['ours_tokens_per_s']:.1f} "
        f"({d['ours_pct_of_roofline']:.0f}%){hf_b1}; auto {d['ours_quantized_tokens_per_s']:.1f} "
        f"({d['ours_quantized_pct_of_roofline']:.0f}% of "
        f"{d['quantized_roofline']['tokens_per_s']:.1f})"
    )
    if report["sharing"]:
        ttft, fork = report["sharing"]["prefix_cache_ttft"], report["sharing"]["fork_peak_blocks"]
        lines.append(
            f"  prefix cache: TTFT cold {ttft['cold_ttft_mean_s']:.3f} s vs cached "
            f"{ttft['cached_ttft_mean_s']:.3f} s ({100 * ttft['cached_over_cold']:.0f}% of cold, "
            f"target <= {100 * ttft['target']:.0f}%; {ttft['cached_tokens_mean']:.0f} of "
            f"{ttft['prompt_tokens_mean']:.0f} prompt tokens cached)"
        )
        lines.append(
            f"  peak blocks, {fork['prompt_tokens']}-token prompt + {fork['max_tokens']}: n=4 "
            f"{fork['peak_blocks_n4']}, 4 requests {fork['peak_blocks_independent']} (with prefix "
            f"cache {fork['peak_blocks_independent_prefix_cached']}), beam width 4 "
            f"{fork['peak_blocks_beam']} ({fork['beam_cow_copies']} CoW copies); n=4 saves "
            f"{100 * fork['n4_saving_vs_independent']:.0f}% (target >= "
            f"{100 * fork['target']:.0f}%)"
        )
    if report.get("structured"):
        st = report["structured"]
        rate = st["output_tokens_per_s"]
        compile_ms = ", ".join(
            f"{k} {v:.1f}" for k, v in st["compile_ms"].items() if k != "tokenizer_once"
        )
        lines.append(
            f"  structured outputs, {st['num_requests']} requests ({st['constrained']} with a "
            f"JSON Schema): {rate['half_constrained']:.1f} vs {rate['unconstrained']:.1f} tok/s "
            f"unconstrained ({100 * st['mixed_over_unconstrained']:.0f}%, target >= "
            f"{100 * st['target']['target']:.0f}%); free requests beside them "
            f"{100 * st['free_requests_ratio']:.0f}% of their pace alone; mask "
            f"{st['mask_ms_per_token']:.3f} ms a token; compile ms: {compile_ms} (vocabulary "
            f"once {st['compile_ms']['tokenizer_once']:.0f} ms)"
        )
    if report.get("allocators"):
        a = report["allocators"]
        p, c, snap = a["paged"], a["contiguous"], a["snapshot_cost"]
        lines.append(
            f"  allocators on {p['num_blocks']} blocks, max_model_len {p['max_model_len']}: "
            f"peak running paged {p['peak_concurrent_sequences']} vs contiguous "
            f"{c['peak_concurrent_sequences']} ({a['concurrency_ratio']:.1f}x, target >= 2.5); "
            f"useful-slot share {100 * p['useful_slot_share_mean']:.1f}% vs "
            f"{100 * c['useful_slot_share_mean']:.1f}%; {p['tokens_per_s']:.1f} vs "
            f"{c['tokens_per_s']:.1f} tok/s"
        )
        lines.append(
            f"  KVSnapshot of {snap['num_blocks']} blocks: {snap['snapshot_ms_median']:.2f} ms "
            f"median (target < {snap['target_ms']:.0f} ms), contiguous shadow "
            f"{snap['shadow_snapshot_ms_median']:.2f} ms"
        )
    for name, t in report["targets"].items():
        if t["ratio"] is not None:
            verdict = "met" if t["met"] else "MISSED"
            lines.append(f"  target {name}: {t['ratio']:.2f} vs >= {t['target']} ({verdict})")
    busy = {k: v for k, v in m["cpu_stall_share"].items() if v is not None and v > CONTENDED}
    if busy:
        shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in busy.items())
        lines.append(f"  WARNING: other processes held the CPU (stall share) during: {shares}")
    lines.append(f"  runtime {report['runtime_s']:.0f} s")
    return "\n".join(lines)
