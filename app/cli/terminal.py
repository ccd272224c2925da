"""`kvscope generate` and `kvscope chat`: the engine in a terminal, streaming as it decodes."""

from __future__ import annotations

import argparse
import sys

from kvscope.app.core.engine_flags import SAMPLING_FLAGS, llm_from_args
from kvscope.engine import LLM, SamplingParams


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**{name: getattr(args, name) for name in SAMPLING_FLAGS})


def stream(llm: LLM, prompt: str, params: SamplingParams, out=None) -> str:
    """Run one request through the step API, writing text as it arrives; returns the full text."""
    out = out or sys.stdout
    engine = llm.engine
    request_id = f"term-{id(prompt)}"
    engine.add_request(request_id, prompt, params)
    shown = 0
    text = ""
    try:
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.request_id != request_id:
                    continue
                text = output.outputs[0].text
                out.write(text[shown:])
                out.flush()
                shown = len(text)
    except KeyboardInterrupt:
        engine.abort_request(request_id)
        out.write(" [stopped]")
    out.write("\n")
    return text


def run(args: argparse.Namespace) -> int:
    try:
        llm = llm_from_args(args)
        params = _params(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "generate":
        prompt = args.prompt
        if args.chat:
            prompt = llm.engine.apply_chat_template([{"role": "user", "content": prompt}])
        try:
            stream(llm, prompt, params)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    return _chat_loop(llm, params, args.system)


def _chat_loop(llm: LLM, params: SamplingParams, system: str | None) -> int:
    messages = [{"role": "system", "content": system}] if system else []
    print("KVScope chat — empty line or Ctrl-D to quit.")
    while True:
        try:
            user = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not user:
            return 0
        messages.append({"role": "user", "content": user})
        sys.stdout.write("assistant> ")
        try:
            prompt = llm.engine.apply_chat_template(messages)
            reply = stream(llm, prompt, params)
        except ValueError as e:
            # e.g. the conversation outgrew max_model_len: say so, keep the session alive.
            print(f"\nerror: {e}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
