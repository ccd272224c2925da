"""Sliding-window models on the engine: a tiny random Mistral (window 32, blocks of 8) and a
Qwen2 with one full and one sliding layer (two KV groups) generate far past the window with HF's
logprobs, hold a flat number of sliding blocks while the full group grows, and keep exact
bookkeeping through preemption, prefix hits and a recorded replay."""

import pytest
import torch
from kv_checks import assert_telemetry_matches
from sliding_models import make_sliding_model
from transformers import AutoModelForCausalLM

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.config import EngineConfig
from kvscope.engine.kv.events import BlocksReleased, read_events
from kvscope.engine.kv.replay import replay_events
from kvscope.engine.llm_engine import LLMEngine

WINDOW, BLOCK = 32, 8
PROMPT = list(range(5, 45))  # 40 tokens: past the window before generating


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return make_sliding_model("mistral", tmp_path_factory.mktemp("m") / "mistral", WINDOW, seed=3)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return make_sliding_model("qwen2", tmp_path_factory.mktemp("q") / "qwen2", 24, seed=4)


def _engine(folder, **overrides) -> LLMEngine:
    knobs = dict(model=str(folder), device="cpu", dtype="float32", block_size=BLOCK)
    knobs.update(overrides)
    return LLMEngine(EngineConfig(**knobs))


def _check(engine: LLMEngine) -> None:
    engine.allocator.check_invariants()
    assert_telemetry_matches(engine.observers.telemetry, engine.allocator)


def _assert_matches_hf(folder, outputs):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for out in outputs:
        prompt, ids = out.prompt_token_ids, out.outputs[0].token_ids
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + ids[:-1]])).logits[0].log_softmax(-1)
        ref = ref[len(prompt) - 1 :]
        for step, top in enumerate(out.outputs[0].logprobs):
            for token, logprob in top.items():
                assert abs(logprob - ref[step, token].item()) < 1e-4, (step, token)
            assert ids[step] == int(ref[step].argmax())


@pytest.mark.parametrize("model", ["mistral", "qwen2"])
def test_generating_past_the_window_matches_hf(model, request):
    folder = request.getfixturevalue(model)
    llm = LLM(model=str(folder), device="cpu", dtype="float32", num_kv_blocks=96, block_size=BLOCK)
    engine = llm.engine
    if model == "mistral":
        assert engine.max_seq_len == 512  # the window is honoured, not a cap on the context
    params = SamplingParams(max_tokens=40, temperature=0.0, logprobs=5, ignore_eos=True)
    outputs = llm.generate([PROMPT, PROMPT[:13]], params)
    _assert_matches_hf(folder, outputs)
    assert engine.allocator.num_released_blocks > 0
    assert llm.kv_snapshot().metrics.blocks_released == engine.allocator.num_released_blocks
    _check(engine)


def _held_per_step(engine: LLMEngine, prompt, max_tokens: int) -> list[tuple[int, ...]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("long", prompt, params)
    held = []
    while engine.has_unfinished_requests():
        engine.step()
        held.append(engine.kv_snapshot().metrics.group_blocks_used)
        _check(engine)
    return held


def test_sliding_blocks_flatten_at_the_window_while_full_ones_grow(qwen2):
    engine = _engine(qwen2, num_kv_blocks=200)
    held = _held_per_step(engine, PROMPT, 120)
    full, sliding = zip(*held[:-1], strict=True)  # the last step frees everything
    # The sliding group holds what the window (24) spans, plus the block being written.
    assert max(sliding[10:]) <= -(-(24 - 1) // BLOCK) + 1
    assert full[-1] == -(-(len(PROMPT) + 119) // BLOCK)
    ignored = _engine(qwen2, num_kv_blocks=200, release_window_blocks=False)
    assert ignored.kv_layout.num_groups == 1
    held_ignored = _held_per_step(ignored, PROMPT, 120)
    assert held_ignored[-2][0] == full[-1]  # one group, never released: grows like the full


def test_mistral_pool_smaller_than_the_context_still_serves_it(mistral):
    """Six blocks hold 48 tokens, yet a 300-token generation runs: its window needs five."""
    engine = _engine(mistral, num_kv_blocks=6, max_num_batched_tokens=8)
    assert engine.max_seq_len == 512
    held = _held_per_step(engine, PROMPT[:20], 280)
    assert max(sum(h) for h in held) <= 6
    _check(engine)


def test_preemption_and_prefix_hits_with_sliding_groups(qwen2):
    """A pool too small for four long replies at once preempts (recompute) and still gives the
    greedy tokens of a roomy pool; a repeated long prompt hits the cache and agrees too."""
    prompts = [PROMPT, PROMPT[::-1], PROMPT[5:], PROMPT[:30]]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    roomy = LLM(model=str(qwen2), device="cpu", dtype="float32", num_kv_blocks=200, block_size=8)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    tight = LLM(model=str(qwen2), device="cpu", dtype="float32", num_kv_blocks=40, block_size=8)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert tight.stats()["num_preemptions"] > 0
    assert got == expected
    _check(tight.engine)
    # The same long prompt again: its full group's blocks and the sliding blocks under the
    # window are cached; the hit is valid for both groups and the reply is the same.
    again = tight.generate([PROMPT], params)[0]
    assert again.outputs[0].token_ids == expected[0]
    assert tight.stats()["prefix_cache_hit_tokens"] > 0
    _check(tight.engine)


def test_a_recorded_sliding_session_replays_exactly(qwen2, tmp_path):
    engine = _engine(qwen2, num_kv_blocks=60)
    path = tmp_path / "sliding.jsonl"
    engine.start_recording(path)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("a", PROMPT, params)
    engine.add_request("b", PROMPT[:20], SamplingParams(max_tokens=40, n=2, temperature=0.8))
    live = []
    while engine.has_unfinished_requests():
        engine.step()
        live.append((engine.kv_snapshot(), engine.shadow_snapshot()))
        _check(engine)
    engine.stop_recording()
    replayed = list(replay_events(path, with_shadow=True))
    assert len(replayed) == len(live)
    for (pool, shadow), (pool_r, shadow_r) in zip(live, replayed, strict=True):
        assert pool.equals(pool_r) and shadow.equals(shadow_r)
    header, events = read_events(path)
    assert header["group_windows"] == [None, 24]
    assert any(isinstance(e, BlocksReleased) for e in events)


def test_a_version_2_recording_still_replays(qwen2, tmp_path):
    """Format 3 added `group` / `start` fields and the header's group_windows: a version-2
    file (one group, none of them) replays into the same snapshots."""
    import json

    engine = _engine(qwen2, num_kv_blocks=60, release_window_blocks=False)
    path = tmp_path / "v3.jsonl"
    engine.start_recording(path)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=12, n=2, temperature=0.8))
    live = []
    while engine.has_unfinished_requests():
        engine.step()
        live.append(engine.kv_snapshot())
    engine.stop_recording()
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["kvscope_events"] = 2
    del header["group_windows"], header["cached_groups"]
    header["counters"].pop("blocks_released")
    old = [json.dumps(header)]
    for line in lines[1:]:
        record = json.loads(line)
        assert record.pop("group", 0) == 0
        if record["kind"] in ("prefix_cache_hit", "sequence_forked", "blocks_freed"):
            assert record.pop("start") == 0  # new in version 3 for these kinds
        old.append(json.dumps(record))
    v2 = tmp_path / "v2.jsonl"
    v2.write_text("\n".join(old) + "\n")
    replayed = [pool for pool, _ in replay_events(v2)]
    assert len(replayed) == len(live)
    assert all(a.equals(b) for a, b in zip(live, replayed, strict=True))
