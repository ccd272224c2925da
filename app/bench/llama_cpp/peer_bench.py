"""`kvscope bench --peer llama.cpp`: llama.cpp and KVScope on the same GGUF, in one run.

Both get the same prompt token ids (our chat template and tokenizer), the same thread count and
greedy decoding past EOS to the same length, one request at a time, alternating round by round
so a neighbour's load falls on both alike. llama.cpp comes from llama-cpp-python, an optional
benchmark dependency that is never imported by the app or the engine; without it the report says
so and still carries our figures. Its default native build may emit instructions a VM forbids
("Illegal instruction"), so `make peer` builds it for the instruction set explicitly.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from kvscope.app.bench.machine import ContentionMeter, machine_info
from kvscope.app.bench.workload import load_chat_workload
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.cpu_threads import default_num_threads
from kvscope.engine.model.loader import default_model_path

PEERS = ("llama.cpp",)
# app/bench/llama_cpp/build.py: llama-server and llama-cpp-python's libraries, built with cmake
# for the instruction set this CPU lists.
PEER_BUILD_HINT = "make peer   (or: python -m kvscope.app.bench.llama_cpp.build --root .cache)"


@dataclass
class RequestTiming:
    prompt_tokens: int
    generated: list[int]  # token ids, greedy
    prefill_s: float  # prompt in, first token out
    decode_s: float  # the remaining tokens

    @property
    def decode_tokens(self) -> int:
        return len(self.generated) - 1


@dataclass
class PeerRun:
    name: str
    version: str | None
    threads: int
    requests: list[RequestTiming] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        tokens = sum(r.decode_tokens for r in self.requests)
        seconds = sum(r.decode_s for r in self.requests)
        return tokens / seconds if seconds else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        tokens = sum(r.prompt_tokens for r in self.requests)
        seconds = sum(r.prefill_s for r in self.requests)
        return tokens / seconds if seconds else 0.0

    def summary(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "threads": self.threads,
            "requests": len(self.requests),
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "per_request": [
                {k: v for k, v in asdict(r).items() if k != "generated"} for r in self.requests
            ],
        }


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return getattr(llama_cpp, "__version__", "unknown")


class LlamaCppRunner:
    """One llama.cpp context over the GGUF; `run` times one greedy request."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(gguf),
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=n_ctx,
            n_batch=512,
            verbose=False,
        )

    def run(self, prompt: list[int], max_tokens: int) -> RequestTiming:
        self.llm.reset()
        start = time.perf_counter()
        # temp 0 is llama.cpp's greedy sampler; no repetition penalty, as on our side.
        stream = self.llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True)
        generated = [next(stream)]
        first = time.perf_counter()
        for token in stream:  # llama.cpp's generate does not stop at EOS by itself
            generated.append(token)
            if len(generated) >= max_tokens:
                break
        stream.close()
        return RequestTiming(len(prompt), generated, first - start, time.perf_counter() - first)


class KVScopeRunner:
    """Our engine, one request at a time (batch 1), as a chat user runs it."""

    def __init__(self, gguf: Path, threads: int, max_model_len: int) -> None:
        self.llm = LLM(model=gguf, num_threads=threads, max_model_len=max_model_len)

    def run(self, prompt: list[int], max_tokens: int) -> RequestTiming:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        out = self.llm.generate([prompt], params)[0]
        end = time.perf_counter()
        m = out.metrics
        assert m is not None and m.first_token_time is not None  # the engine's, finished
        prefill = m.first_token_time - m.arrival_time
        return RequestTiming(
            len(prompt), list(out.outputs[0].token_ids), prefill, end - start - prefill
        )


def greedy_agreement(a: list[int], b: list[int]) -> int:
    """Tokens the two greedy runs agree on before they first differ."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run_peer_bench(
    out: Path,
    peer: str = "llama.cpp",
    gguf: Path | None = None,
    num_prompts: int = 8,
    max_tokens: int = 128,
    threads: int | None = None,
    rounds: int = 2,
) -> dict:
    """Alternate KVScope and the peer `rounds` times over the same prompts; write JSON + PNG."""
    if peer not in PEERS:
        raise ValueError(f"peer {peer!r} is not one of {PEERS}")
    gguf = Path(gguf) if gguf else default_model_path()
    threads = threads or default_num_threads()
    requests = load_chat_workload(None, num_prompts, None)
    ours = KVScopeRunner(gguf, threads, max_model_len=2048)
    engine = ours.llm.engine
    prompts = [engine.tokenize(engine.apply_chat_template(r.messages))[1] for r in requests]
    n_ctx = max(len(p) for p in prompts) + max_tokens + 8
    version = llama_cpp_version()
    theirs = LlamaCppRunner(gguf, threads, n_ctx) if version else None
    meter = ContentionMeter()
    # Warm both (first-call allocations, thread pools) before anything is timed.
    ours.run(prompts[0], 4)
    if theirs:
        theirs.run(prompts[0], 4)
    runs: dict[str, list[PeerRun]] = {"kvscope": [], peer: []}
    for r in range(rounds):
        with meter.phase(f"kvscope_round{r}"):
            runs["kvscope"].append(_run_all(ours, "kvscope", prompts, max_tokens, threads, None))
        if theirs:
            with meter.phase(f"{peer}_round{r}"):
                runs[peer].append(_run_all(theirs, peer, prompts, max_tokens, threads, version))
    best = {
        name: max(rs, key=lambda run: run.decode_tokens_per_s) for name, rs in runs.items() if rs
    }
    report = {
        "machine": machine_info() | {"cpu_stall_share": meter.stall_share},
        "model": str(gguf),
        "threads": threads,
        "num_prompts": len(prompts),
        "max_tokens": max_tokens,
        "rounds": rounds,
        "kvscope": best["kvscope"].summary() | {"weights": engine.stats()["weight_format"]},
        "kvscope_rounds_decode_tokens_per_s": [x.decode_tokens_per_s for x in runs["kvscope"]],
        "peer": best[peer].summary() if peer in best else None,
        "peer_rounds_decode_tokens_per_s": [x.decode_tokens_per_s for x in runs[peer]],
        "peer_missing": None
        if theirs
        else f"{peer} is not installed; build it with: {PEER_BUILD_HINT}",
    }
    if theirs:
        ratio = best["kvscope"].decode_tokens_per_s / best[peer].decode_tokens_per_s
        report["decode_ratio_vs_peer"] = ratio
        report["greedy_tokens_agreeing"] = [
            greedy_agreement(a.generated, b.generated)
            for a, b in zip(best["kvscope"].requests, best[peer].requests, strict=True)
        ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_peer.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_peer(report, out / "bench_peer.png")
    return report


def _run_all(runner, name, prompts, max_tokens, threads, version) -> PeerRun:
    run = PeerRun(name, version, threads)
    run.requests = [runner.run(p, max_tokens) for p in prompts]
    return run


def summarize_peer(report: dict) -> str:
    ours = report["kvscope"]
    lines = [
        f"batch-1 greedy, {report['num_prompts']} prompts x {report['max_tokens']} tokens, "
        f"{report['threads']} threads",
        f"  KVScope   decode {ours['decode_tokens_per_s']:6.1f} tok/s   "
        f"prefill {ours['prefill_tokens_per_s']:7.1f} tok/s",
    ]
    peer = report["peer"]
    if peer is None:
        lines.append(f"  peer: {report['peer_missing']}")
    else:
        lines.append(
            f"  {peer['name']:<9} decode {peer['decode_tokens_per_s']:6.1f} tok/s   "
            f"prefill {peer['prefill_tokens_per_s']:7.1f} tok/s   ({peer['version']})"
        )
        lines.append(f"  KVScope / {peer['name']} decode: {report['decode_ratio_vs_peer']:.2f}x")
    return "\n".join(lines)


def plot_peer(report: dict, path: Path) -> None:
    fig = Figure(figsize=(9, 4), layout="constrained")
    decode, prefill = fig.subplots(1, 2)
    entries = [report["kvscope"]] + ([report["peer"]] if report["peer"] else [])
    names = [e["name"] for e in entries]
    colors = ["#2a7ab9", "#d9822b"][: len(entries)]
    for ax, key, title in (
        (decode, "decode_tokens_per_s", "batch-1 decode"),
        (prefill, "prefill_tokens_per_s", "prefill"),
    ):
        values = [e[key] for e in entries]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], padding=2)
        ax.set_title(f"{title}, {report['threads']} threads")
        ax.set_ylabel("tokens / s")
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    if not report["peer"]:
        decode.text(0.5, 0.5, "peer not installed", transform=decode.transAxes, ha="center")
    fig.savefig(path, dpi=100)
