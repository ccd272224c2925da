"""`kvscope bench --peer llama.cpp --models`: KVScope and llama.cpp on the models people run, at
every thread count, in one table.

Per (model, threads) both engines are loaded once, on the same GGUF and thread count, and
alternate round by round (so a neighbour's load falls on both alike); each round times a batch-1
greedy decode past EOS and a 512-token prefill (its time to the first token, so prefill tok/s =
prompt / TTFT). Both get the same token ids, from our tokenizer. The best round is reported and
every round is kept. Prefix caching is off on our side and llama.cpp's context is reset before
every request, so no round reuses the previous round's KV. Each row's roofline is the bandwidth
measured at its thread count over the GGUF's bytes per decode token (peer_models_setup).
llama.cpp is optional (llama-cpp-python): without it the table carries our figures and says so.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
from pathlib import Path

import torch

from kvscope.app.bench.llama_cpp.peer_bench import (
    PEER_BUILD_HINT,
    KVScopeRunner,
    LlamaCppRunner,
    RequestTiming,
    greedy_agreement,
    llama_cpp_version,
)
from kvscope.app.bench.llama_cpp.peer_models_setup import (
    ModelChoice,
    choose_models,
    cpu_description,
    decode_weight_bytes,
    head_is_tied,
    measure_bandwidth_at,
    parse_model_names,
    thread_counts,
)
from kvscope.app.bench.llama_cpp.peer_models_table import (
    finish_row,
    markdown_table,
    plot_peer_models,
)
from kvscope.app.bench.machine import ContentionMeter, machine_info
from kvscope.app.bench.workload import load_chat_workload
from kvscope.engine import LLM
from kvscope.engine.child_python import SAFE_PATH_FLAGS
from kvscope.engine.cpu_kernels import prepare_cpu_kernels

PEER = "llama.cpp"
OURS = "kvscope"
DECODE_PROMPT_TOKENS = 32  # decode's prompt: short, a chat turn's context, not prefill's 512
# Room past the prompt and the reply: 512 + 64 + 64 = 640 with the defaults.
LEN_SLACK = 64


class OurRunner(KVScopeRunner):
    """peer_bench's runner with prefix caching off: a round's prefill must not find the last
    round's blocks cached."""

    def __init__(self, gguf: Path, threads: int, max_model_len: int) -> None:
        self.llm = LLM(
            model=gguf,
            num_threads=threads,
            max_model_len=max_model_len,
            enable_prefix_caching=False,
        )


# One load and two tokens in a child process: a llama.cpp build with instructions this CPU (or its
# hypervisor) refuses dies of SIGILL, which would take the whole bench (or pytest) with it.
_PROBE = (
    "import sys; from pathlib import Path; "
    "from kvscope.app.bench.llama_cpp.peer_bench import LlamaCppRunner; "
    "LlamaCppRunner(Path(sys.argv[1]), 1, 64).run([1, 2, 3, 4], 2)"
)


def peer_failure(gguf: Path, timeout_s: float = 600) -> str | None:
    """None when llama.cpp runs two tokens of `gguf` in a child process, else why it did not."""
    try:
        done = subprocess.run(
            [sys.executable, *SAFE_PATH_FLAGS, "-c", _PROBE, str(gguf)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"llama.cpp took over {timeout_s:.0f} s for 2 tokens of {gguf.name}"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        hint = " (its build uses instructions this CPU refuses)" if name == "SIGILL" else ""
        return f"llama.cpp died of {name} on {gguf.name}{hint}"
    last = done.stderr.strip().splitlines()[-1:] or ["no message"]
    return f"llama.cpp failed on {gguf.name} (exit {done.returncode}): {last[0]}"


def workload_token_ids(llm: LLM, count: int) -> list[int]:
    """`count` token ids of the bundled chat workload's text (repeated where it is shorter),
    from this engine's tokenizer; the peer gets the same ids."""
    text = "\n\n".join(
        m["content"] for r in load_chat_workload(None, None, None) for m in r.messages
    )
    ids = llm.engine.tokenize(text)[1]
    if not ids:
        raise ValueError("the bundled workload tokenized to no tokens")
    return (ids * (count // len(ids) + 1))[:count]


def check_settings(threads: list[int], rounds: int, decode_tokens: int, prompt_tokens: int) -> None:
    """Raises ValueError naming the first setting out of its range."""
    if not threads or min(threads) < 1:
        raise ValueError(f"threads must be a non-empty list of counts >= 1, got {threads}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if decode_tokens < 2:
        raise ValueError(f"decode tokens (--decode-steps) must be >= 2, got {decode_tokens}")
    if prompt_tokens < 1:
        raise ValueError(f"prompt tokens (--prompt-tokens) must be >= 1, got {prompt_tokens}")


def run_peer_models(
    out: Path,
    models: list[ModelChoice],
    threads: list[int],
    rounds: int = 3,
    decode_tokens: int = 64,
    prompt_tokens: int = 512,
    bandwidth_bytes: int = 1 << 30,
) -> dict:
    """Every (model, threads) row, both engines alternating `rounds` times; writes
    bench_peer_models.json and .png under `out` and returns the report."""
    check_settings(threads, rounds, decode_tokens, prompt_tokens)
    version = llama_cpp_version()
    meter = ContentionMeter()
    # Measured before any engine is built: a built engine's weights would share the memory bus.
    bandwidth = {t: measure_bandwidth_at(t, bandwidth_bytes) for t in threads}
    start_numba_threads(max(threads))
    rows = []
    for choice in models:
        if choice.path is None:
            rows.append({"model": choice.name, "skipped": choice.skipped})
            print(f"{choice.name}: skipped: {choice.skipped}", flush=True)
            continue
        per_token = decode_weight_bytes(choice.path)
        failed = peer_failure(choice.path) if version else None
        for t in threads:
            peer = None if failed else version
            row = _run_row(choice, t, peer, meter, rounds, decode_tokens, prompt_tokens, per_token)
            rows.append(finish_row(row | {"peer_failed": failed}, bandwidth[t]))
            print(_progress(rows[-1]), flush=True)
    report = {
        "machine": machine_info() | {"cpu_stall_share": meter.stall_share},
        "cpu": cpu_description(),
        "peer": {
            "name": PEER,
            "version": version,
            "missing": None if version else f"{PEER} is not installed; {PEER_BUILD_HINT}",
        },
        "settings": {
            "threads": threads,
            "rounds": rounds,
            "decode_tokens": decode_tokens,
            "decode_prompt_tokens": DECODE_PROMPT_TOKENS,
            "prompt_tokens": prompt_tokens,
            "bandwidth_bytes": bandwidth_bytes,
        },
        "bandwidth_gb_s": {str(t): b / 1e9 for t, b in bandwidth.items()},
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_peer_models.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_peer_models(report, out / "bench_peer_models.png")
    return report


def start_numba_threads(threads: int) -> None:
    """numba's kernels loaded, and its OpenMP threads started, before llama.cpp first runs in
    this process: started after llama.cpp had run (a 2-thread row after a 1-thread one), the
    first parallel call died of a call through a null pointer (the fused decode's warm-up)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the kernels' warm-up starts the threads from 2 on
    try:
        prepare_cpu_kernels("cpu")
    finally:
        torch.set_num_threads(before)


def _run_row(
    choice: ModelChoice,
    threads: int,
    version: str | None,
    meter: ContentionMeter,
    rounds: int,
    decode_tokens: int,
    prompt_tokens: int,
    bytes_per_token: int,
) -> dict:
    path = choice.path
    assert path is not None  # run_peer_models skips a choice without a GGUF before its rows
    max_model_len = prompt_tokens + decode_tokens + LEN_SLACK
    ours = OurRunner(path, threads, max_model_len)
    try:
        prompt = workload_token_ids(ours.llm, prompt_tokens)
        short = prompt[: min(DECODE_PROMPT_TOKENS, prompt_tokens)]
        weights = ours.llm.stats()["weight_format"]
        theirs = LlamaCppRunner(path, threads, max_model_len) if version else None
        try:
            runners = {OURS: ours} | ({PEER: theirs} if theirs else {})
            for runner in runners.values():  # first-call allocations, thread pools: untimed
                runner.run(short, 4)
            kept: dict[str, list[dict]] = {name: [] for name in runners}
            for r in range(rounds):
                for name, runner in runners.items():
                    with meter.phase(f"{choice.name}_t{threads}_{name}_round{r}"):
                        kept[name].append(_one_round(runner, short, prompt, decode_tokens))
        finally:
            _close(theirs)
    finally:
        # Freed before the next row loads its own weights (two 3B copies need not fit at once).
        del ours.llm
        gc.collect()
    row = {
        "model": choice.name,
        "file": str(path),
        "threads": threads,
        "weight_bytes_per_token": bytes_per_token,
        "tied_head": head_is_tied(path),
        OURS: {"weights": weights, "rounds": [r["figures"] for r in kept[OURS]]},
        PEER: {"version": version, "rounds": [r["figures"] for r in kept[PEER]]}
        if PEER in kept
        else None,
    }
    if PEER in kept:
        row["greedy_tokens_agreeing"] = greedy_agreement(
            kept[OURS][-1]["generated"], kept[PEER][-1]["generated"]
        )
    return row


def _one_round(runner, short: list[int], prompt: list[int], decode_tokens: int) -> dict:
    decode: RequestTiming = runner.run(short, decode_tokens)
    prefill: RequestTiming = runner.run(prompt, 1)
    return {
        "generated": decode.generated,
        "figures": {
            "decode_tokens": decode.decode_tokens,
            "decode_s": decode.decode_s,
            "decode_tokens_per_s": decode.decode_tokens / decode.decode_s
            if decode.decode_s > 0
            else 0.0,
            "prompt_tokens": prefill.prompt_tokens,
            "ttft_s": prefill.prefill_s,
            "prefill_tokens_per_s": prefill.prompt_tokens / prefill.prefill_s
            if prefill.prefill_s > 0
            else 0.0,
        },
    }


def _close(runner: LlamaCppRunner | None) -> None:
    if runner is None:
        return
    close = getattr(runner.llm, "close", None)  # llama-cpp-python >= 0.2.8x frees its context
    if close is not None:
        close()
    del runner.llm
    gc.collect()


def _progress(row: dict) -> str:
    ours, theirs = row[OURS]["best"], (row[PEER] or {}).get("best")
    text = (
        f"{row['model']:>11} {row['threads']} threads: KVScope decode "
        f"{ours['decode_tokens_per_s']:.1f} tok/s, prefill {ours['prefill_tokens_per_s']:.1f}"
    )
    if row.get("peer_failed"):
        text += f"; {row['peer_failed']}"
    if theirs:
        text += (
            f"; llama.cpp {theirs['decode_tokens_per_s']:.1f}, {theirs['prefill_tokens_per_s']:.1f}"
        )
    return text


def run_peer_models_cli(args) -> int:
    """`kvscope bench --peer llama.cpp --models [--models-only A,B] [--num-threads N]
    [--rounds R] [--decode-steps D] [--prompt-tokens P]`: run, print the markdown table."""
    from kvscope.app.core.paths import cache_dir

    threads = [args.num_threads] if args.num_threads is not None else thread_counts()
    try:  # the flags, before anything is loaded or written
        names = parse_model_names(args.models_only)
        check_settings(threads, args.rounds, args.decode_steps, args.prompt_tokens)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    report = run_peer_models(
        out,
        choose_models(names, cache_dir() / "bench-models"),
        threads,
        rounds=args.rounds,
        decode_tokens=args.decode_steps,
        prompt_tokens=args.prompt_tokens,
    )
    print()
    print(markdown_table(report))
    print(f"\n  wrote {out / 'bench_peer_models.json'} and bench_peer_models.png")
    return 0
