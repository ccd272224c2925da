"""The `kvscope` entry point: the window by default, or a terminal subcommand."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import typing

from kvscope import app as app_package
from kvscope.app.cli import hub_commands, search_command, whatif
from kvscope.app.core.block_hashes import ALGOS, DEFAULT_ALGO
from kvscope.app.core.defaults import MAX_MODEL_LEN_HELP
from kvscope.app.core.engine_flags import SAMPLING_FLAGS, engine_knobs
from kvscope.engine.config import KNOB, QUANTIZATIONS, EngineConfig


def _engine_args(p: argparse._ActionsContainer, skip=()) -> None:  # a parser or a group of one
    hints = typing.get_type_hints(EngineConfig)
    for f in engine_knobs():
        knob = f.metadata[KNOB]
        if "--" + f.name.replace("_", "-") in skip:
            continue
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_flag_type(hints[f.name]),
            default=f.default,
            choices=knob.choices or None,
            help=MAX_MODEL_LEN_HELP if f.name == "max_model_len" else knob.help,
        )


def _flag_type(hint: object) -> type:
    """int for `int | None`; str for a string or a path."""
    kinds = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    return kinds[0] if len(kinds) == 1 else str


def _client_counts(text: str) -> int | list[int]:
    """`--clients 8` -> 8; `--clients 1,8,32` -> [1, 8, 32] (the --peer-server cells)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a list like 1,8,32: {text!r}") from None
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"client counts must be >= 1, got {text!r}")
    return counts[0] if len(counts) == 1 else counts


def _sampling_args(p: argparse.ArgumentParser) -> None:
    for name, (kind, default) in SAMPLING_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default)


def _byte_count(text: str) -> int:
    from kvscope.engine.sizing.planner import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help="GGUF, HF folder or config.json (default: bundled model)"
    )
    p.add_argument("--layers", type=int, default=None, help="instead of --model, with the next two")
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--dtype", default="fp16", help="KV dtype: fp32, bf16, fp16 or fp8")
    p.add_argument("--context", type=int, required=True, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=1, help="sequences at that context")
    p.add_argument("--vram", type=_byte_count, default=None, help="e.g. 24GiB, 80GB, 8589934592")
    p.add_argument("--weights", type=_byte_count, default=None, help="default: from --model")
    p.add_argument("--weights-dtype", default=None, help="of the estimate (default: --dtype)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--quantization",
        default="auto",
        choices=QUANTIZATIONS,
        help="how the engine would keep the weights (auto: a GGUF's own quantization)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _run_map_bench(out: str) -> int:
    """`kvscope bench --map`: here, not in app/bench, which never imports the desktop."""
    import json
    from pathlib import Path

    from kvscope.app.desktop.blockmap.redraw_bench import run_map_redraw_bench

    report = run_map_redraw_bench()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "bench_map.json").write_text(json.dumps(report, indent=2))
    print(f"block map redraw, one map, median (p90) ms on {report['cpu']}:")
    for run in report["runs"]:
        width, height = run["view_px"]
        print(
            f"  {run['blocks']:>7,} blocks {run['pool']:9s} {width}x{height}:"
            f" {run['median_ms']:5.1f} ({run['p90_ms']:.1f})"
        )
    verdict = "within" if report["within_budget"] else "OVER"
    print(
        f"  worst median {report['worst_median_ms']:.1f} ms: {verdict} the"
        f" {report['frame_budget_ms']:.0f} ms frame budget"
    )
    print(f"  wrote {Path(out) / 'bench_map.json'}")
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    import json

    from kvscope.engine.sizing.planner import plan_kv

    try:
        plan = plan_kv(
            args.model,
            num_layers=args.layers,
            num_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            dtype=args.dtype,
            context=args.context,
            batch=args.batch,
            block_size=args.block_size,
            vram_bytes=args.vram,
            weights_bytes=args.weights,
            gpu_memory_utilization=args.gpu_memory_utilization,
            weights_dtype=args.weights_dtype,
            quantization=args.quantization,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.table())
    return 0


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or KVSCOPE_API_KEY)"
    )
    p.add_argument("--served-model-name", default=None, help="default: the model file's name")
    p.add_argument(
        "--kv-events", default=None, metavar="ENDPOINT", help="publish vLLM KV events (ZMQ PUB)"
    )
    p.add_argument(
        "--kv-events-replay", default=None, metavar="ENDPOINT", help="ZMQ ROUTER for missed events"
    )
    p.add_argument("--kv-events-topic", default="", help="ZMQ topic of the KV events")
    p.add_argument(
        "--kv-events-encoding",
        default="map",
        choices=("map", "array"),
        help="events as maps (vLLM 0.33's layout) or positional arrays (older vLLM's)",
    )
    p.add_argument(
        "--prefix-caching-hash-algo",
        default=DEFAULT_ALGO,
        choices=ALGOS,
        help="the block hashes the KV events carry, computed as vLLM's option of this name does",
    )
    _engine_args(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope", description="Chat with a local LLM and watch its KV cache."
    )
    parser.add_argument("--demo", type=int, default=None, metavar="N", help="run N demo chats")
    parser.add_argument("--screenshot", default=None, metavar="PNG", help="save the window")
    remote = parser.add_argument_group(
        "remote servers", "watch and chat with OpenAI-compatible servers (vLLM, kvscope serve)"
    )
    remote.add_argument(
        "--connect", action="append", default=[], metavar="URL", help="e.g. http://host:8000"
    )
    remote.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="the server's KV events (ZMQ PUB, e.g. tcp://host:5557), in --connect order",
    )
    remote.add_argument(
        "--kv-replay",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="its replay socket (ZMQ ROUTER), in --connect order",
    )
    remote.add_argument(
        "--api-key", action="append", default=[], help="one for all, or one per --connect"
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="complete one prompt and print it")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    _engine_args(gen)
    _sampling_args(gen)
    chat = sub.add_parser("chat", help="a streaming chat in the terminal")
    chat.add_argument("--system", default=None, help="system prompt")
    _engine_args(chat)
    _sampling_args(chat)
    bench = sub.add_parser("bench", help="benchmark the engine against HF transformers")
    bench.add_argument("--out", default="bench_out", help="folder for JSON + PNG")
    bench.add_argument("--num-requests", type=int, default=None)
    bench.add_argument("--workload", default=None, help="workload JSON (default: bundled)")
    bench.add_argument("--max-tokens-cap", type=int, default=None, help="shorten every request")
    bench.add_argument(
        "--hf-batch-size", type=int, default=None, help="HF static batch size (default: all)"
    )
    bench.add_argument(
        "--hf-sequential", type=int, default=4, metavar="N", help="requests HF runs one by one"
    )
    bench.add_argument("--decode-steps", type=int, default=64, help="timed batch-1 decode steps")
    bench.add_argument("--skip-hf", action="store_true", help="only our engine and the roofline")
    bench.add_argument(
        "--models",
        action="store_true",
        help="instead: load synthetic 1.1B/3B Q4_K_M GGUFs kept quantized and dequantized "
        "(bench_models.json); with --peer llama.cpp: both engines on each model at 1, 2 and "
        "all physical cores (bench_peer_models.json)",
    )
    bench.add_argument(
        "--skip-sharing", action="store_true", help="skip the prefix-cache and forking figures"
    )
    bench.add_argument(
        "--skip-allocators", action="store_true", help="skip the paged vs contiguous comparison"
    )
    bench.add_argument(
        "--skip-structured",
        action="store_true",
        help="skip structured outputs under load (half the requests with a JSON Schema)",
    )
    bench.add_argument(
        "--gpu",
        action="store_true",
        help="instead: Triton decode kernel + engine decode vs SDPA on a CUDA GPU (bench_gpu.json)",
    )
    bench.add_argument(
        "--serve",
        action="store_true",
        help="instead: concurrent streaming clients against `kvscope serve` (bench_serve.json)",
    )
    bench.add_argument(
        "--clients",
        type=_client_counts,
        default=None,
        help="--serve: concurrent clients (default 64); with --peer-server a list, one cell "
        "each (default 1,8,32)",
    )
    bench.add_argument(
        "--serve-requests",
        type=int,
        default=None,
        help="--serve: total requests (default 2x clients; per cell with --peer-server, "
        "4x clients and at least 16)",
    )
    bench.add_argument(
        "--serve-seconds",
        type=float,
        default=None,
        help="--serve: time bound (default 120 s; per cell with --peer-server, 60 s)",
    )
    bench.add_argument(
        "--target",
        default=None,
        metavar="URL",
        help="--serve: drive this running OpenAI-compatible server (http://host:port) instead "
        "of starting `kvscope serve`",
    )
    bench.add_argument(
        "--peer-server",
        default=None,
        choices=("llama.cpp",),
        help="--serve: `kvscope serve` and llama.cpp's llama-server in turn on the same GGUF "
        "and threads (bench_serve_peer.json)",
    )
    bench.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="--peer-server: the binary (default: $KVSCOPE_LLAMA_SERVER, `make peer`'s, PATH)",
    )
    bench.add_argument("--serve-max-tokens", type=int, default=32, help="--serve: tokens per reply")
    bench.add_argument(
        "--soak",
        type=float,
        default=None,
        metavar="MINUTES",
        help="instead: well-behaved and hostile clients against `kvscope serve` and a hostile "
        "peer against the remote view for MINUTES; RSS, losses, latency (bench_soak.json)",
    )
    bench.add_argument("--json", default=None, help="--soak: write the report here instead")
    bench.add_argument(
        "--threads",
        action="store_true",
        help="instead: batch-1 decode at each thread count, quiet and with one core busy "
        "(bench_threads.json)",
    )
    bench.add_argument(
        "--peer",
        default=None,
        choices=("llama.cpp",),
        help="instead: batch-1 greedy decode of the same GGUF against this peer, alternating "
        "(bench_peer.json; llama-cpp-python must be installed)",
    )
    bench.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="threads for --peer (default: ours; with --models: 1, 2 and every physical core)",
    )
    bench.add_argument(
        "--models-only",
        default=None,
        metavar="NAMES",
        help="--peer --models: only these rows, comma-separated (bundled, 1.1B-Q4_0, 1.1B, 3B, "
        "gemma3-270m)",
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="--peer --models: alternating rounds per row"
    )
    bench.add_argument(
        "--prompt-tokens", type=int, default=512, help="--peer --models: the prefill prompt"
    )
    bench.add_argument(
        "--sliding",
        action="store_true",
        help="instead: KV blocks held vs tokens for one long generation on tiny sliding-window "
        "models, windows honoured and ignored (bench_sliding.json)",
    )
    bench.add_argument(
        "--whatif",
        action="store_true",
        help="instead: the what-if simulator against real runs under six settings, and a sweep's "
        "time (bench_whatif.json)",
    )
    bench.add_argument(
        "--sliding-tokens", type=int, default=4000, help="--sliding: tokens to generate"
    )
    bench.add_argument(
        "--map",
        action="store_true",
        help="instead: the block map's redraw time per telemetry tick, pools of 64 to 200,000 "
        "blocks, offscreen (bench_map.json)",
    )
    bench.add_argument(
        "--download",
        action="store_true",
        help="instead: `kvscope pull` of a 200 MB file from a loopback hub against a plain "
        "HTTP read of it, hashing included (bench_download.json)",
    )
    bench.add_argument(
        "--mixed",
        action="store_true",
        help="instead: a prompt chunk beside running decodes against one alone, and the "
        "decodes' inter-token time beside a long prefill (bench_mixed.json)",
    )
    # The engine knobs for --serve, but for flags bench already has (their value serves both).
    _engine_args(bench.add_argument_group("engine of --serve"), skip=bench._option_string_actions)
    _plan_args(sub.add_parser("plan", help="KV-cache memory arithmetic, no weights loaded"))
    _serve_args(sub.add_parser("serve", help="an OpenAI-compatible server on this machine"))
    record = sub.add_parser("record", help="run chat requests and save the KV events to a file")
    record.add_argument("out", help="events file (JSON lines)")
    record.add_argument("--num-requests", type=int, default=8)
    record.add_argument("--max-tokens-cap", type=int, default=64)
    _engine_args(record)
    replay = sub.add_parser("replay", help="replay a recorded KV event file, step by step")
    replay.add_argument("events", help="file written by `kvscope record` or the app")
    whatif.add_parser(sub)
    search_command.add_parser(sub)
    hub_commands.add_pull_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit status; Ctrl-C at any point ends it with a line and 130 (while the
    imports run, before this, kvscope/app/__init__.py's handler does the same)."""
    loading = signal.getsignal(signal.SIGINT) is app_package.interrupted_while_loading
    if loading and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a command may catch it
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _dispatch(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("generate", "chat"):
        from kvscope.app.cli import terminal

        return terminal.run(args)
    if args.command == "plan":
        return _run_plan(args)
    if args.command in ("record", "replay"):
        from kvscope.app.cli import recording

        return recording.run(args)
    if args.command == "whatif":
        return whatif.run(args)
    if args.command == "pull":
        return hub_commands.run_pull(args)
    if args.command == "search":
        return search_command.run(args)
    if args.command == "serve":
        from kvscope.app.serve.serve_command import run as run_server

        return run_server(args)
    if args.command == "bench" and args.map:
        return _run_map_bench(args.out)
    if args.command == "bench":
        from kvscope.app.bench.run import run_bench

        return run_bench(args)
    if args.screenshot and not os.environ.get("DISPLAY") and sys.platform.startswith("linux"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        connections = connections_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from kvscope.app.desktop.launch import run_window

    return run_window(demo=args.demo, screenshot=args.screenshot, connections=connections)


def connections_from_args(args) -> list:
    """--connect URL ... with --kv-events / --kv-replay / --api-key paired by order."""
    from kvscope.app.remote.connection import ConnectionSpecError, parse_connection

    urls = args.connect
    for flag, values in (("--kv-events", args.kv_events), ("--kv-replay", args.kv_replay)):
        if len(values) > len(urls):
            raise ConnectionSpecError(f"{len(values)} {flag} for {len(urls)} --connect")
    keys = args.api_key
    if len(keys) not in (0, 1, len(urls)):
        raise ConnectionSpecError(
            f"{len(keys)} --api-key for {len(urls)} --connect: give 1 or each"
        )
    env_key = os.environ.get("KVSCOPE_API_KEY", "")
    found = []
    for i, url in enumerate(urls):
        key = keys[i] if len(keys) == len(urls) else (keys[0] if keys else env_key)
        found.append(
            parse_connection(
                url,
                kv_events=args.kv_events[i] if i < len(args.kv_events) else None,
                kv_replay=args.kv_replay[i] if i < len(args.kv_replay) else None,
                api_key=key,
            )
        )
    labels = [c.label for c in found]
    if len(set(labels)) != len(labels):
        raise ConnectionSpecError(f"the same server is given twice: {labels}")
    return found


if __name__ == "__main__":
    sys.exit(main())
