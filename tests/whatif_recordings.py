"""A small recorded session with a traffic trace, and edits that make it hostile: what the
what-if bound tests (trace reader, knobs, simulation budget, the command) share."""

from __future__ import annotations

import json
from pathlib import Path

from sliding_models import make_sliding_model


def record_session(folder: Path) -> Path:
    """Six requests on a tiny two-group model, 40 blocks of 8 tokens: the session file."""
    from kvscope.engine import EngineConfig, LLMEngine, SamplingParams

    model = make_sliding_model("qwen2", folder / "m", 24, seed=2)
    engine = LLMEngine(
        EngineConfig(
            model=str(model), device="cpu", dtype="float32", block_size=8, num_kv_blocks=40
        )
    )
    path = folder / "session.jsonl"
    engine.start_recording(path)
    for i in range(6):
        params = SamplingParams(max_tokens=10 + 3 * i, temperature=0.0, ignore_eos=True)
        engine.add_request(f"c{i}", [2 + (5 * i + j) % 400 for j in range(12 + 7 * i)], params)
    while engine.has_unfinished_requests():
        engine.step()
    engine.stop_recording()
    return path


def with_trace_settings(src: Path, dst: Path, **settings: object) -> Path:
    """A copy of `src` whose header's trace settings have `settings` instead."""
    lines = src.read_text().splitlines()
    header = json.loads(lines[0])
    header["trace"].update(settings)
    dst.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return dst


def with_field(src: Path, dst: Path, kind: str, field: str, raw: str) -> tuple[Path, int]:
    """A copy of `src` whose first line of `kind` has `field` set to the JSON text `raw` (NaN,
    Infinity: what Python's json writes and reads); the path and that line's number."""
    lines = src.read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if f'"kind":"{kind}"' in line)
    record = json.loads(lines[number])
    record[field] = "@raw@"
    lines[number] = json.dumps(record).replace('"@raw@"', raw)
    dst.write_text("\n".join(lines) + "\n")
    return dst, number + 1
