"""`kvscope record` and `kvscope replay`: save a session's KV events, and step through them."""

from __future__ import annotations

import argparse
import sys

from kvscope.app.bench.workload import load_chat_workload


def run(args: argparse.Namespace) -> int:
    try:
        return record(args) if args.command == "record" else replay(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def record(args: argparse.Namespace) -> int:
    from kvscope.app.core.engine_flags import llm_from_args
    from kvscope.engine import SamplingParams

    requests = load_chat_workload(None, args.num_requests, args.max_tokens_cap)
    llm = llm_from_args(args)
    engine = llm.engine
    engine.start_recording(args.out)
    try:
        for i, r in enumerate(requests):
            prompt = engine.apply_chat_template(r.messages)
            engine.add_request(f"chat-{i}/0", prompt, SamplingParams(max_tokens=r.max_tokens))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.stop_recording()
    num_events = engine.observers.events.total
    print(f"recorded {num_events} events over {engine.num_steps} steps to {args.out}")
    return 0


def replay(args: argparse.Namespace) -> int:
    from kvscope.engine.kv.replay import replay_events

    print("step  used  cached  shared  running  waiting  useful%  naive-used  naive-waiting")
    for pool, shadow in replay_events(args.events, with_shadow=True):
        m = pool.metrics
        naive = (
            f"{shadow.metrics.blocks_used + shadow.metrics.blocks_reserved:10d}  "
            f"{shadow.metrics.num_waiting:13d}"
            if shadow is not None
            else f"{'-':>10}  {'-':>13}"
        )
        print(
            f"{pool.step:4d}  {m.blocks_used:4d}  {m.blocks_cached:6d}  {m.blocks_shared:6d}  "
            f"{m.num_running:7d}  {m.num_waiting:7d}  {100 * m.useful_slot_share:6.1f}  {naive}"
        )
    return 0
