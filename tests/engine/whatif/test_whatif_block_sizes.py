"""The what-if is exact at every block size (issue 44): 16 chats behind a shared system prompt,
greedy to fixed lengths, recorded at one block size and replayed at another, equal a real run
at that block size step by step: pool size, blocks held and cached, running, waiting,
preemptions, prefix hits (and of those, the re-reads after preemption), on a full-attention
model and on one whose layers form two KV groups (one sliding).

The pool is bytes, as the app's is, so a block of 32 gets half as many blocks as one of 16: it
is tight enough to preempt at every block size. The requests all arrive before the first
step; a run whose requests arrive in wall time lands them on other steps from one run to the
next (two real runs at block size 32 of the same 16 chats peaked at 76 and 77 blocks, the
what-if at 78: noise of the arrivals, not of the simulation).
"""

from __future__ import annotations

import pytest
from sliding_models import make_sliding_model
from tiny_models import random_model, tiny_config

from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.bench.sliding_window import VOCAB, write_wordlevel_tokenizer
from kvscope.engine.kv.events import SequenceAdmitted
from kvscope.engine.trace import Trace
from kvscope.engine.whatif import WhatIf, recorded_summary, simulate

BLOCK_SIZES = (8, 16, 32)
FIGURES = (
    "steps",
    "preemptions",
    "peak_running",
    "peak_blocks_used",
    "waited",
    "rejected",
    "prefix_hit_tokens",
)
POOL_BLOCKS_OF_16 = 40  # the 16 chats need ~53 at once: every block size preempts
SYSTEM = [(7 * i) % 500 + 2 for i in range(70)]  # 2 blocks of 32 and 6 tokens: not aligned


def _chats() -> list[tuple[list[int], SamplingParams]]:
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    return [
        (SYSTEM + [(13 * i + j) % 500 + 2 for j in range(9 + i % 5)], greedy) for i in range(16)
    ]


@pytest.fixture(scope="module", params=["full", "sliding"])
def model(request, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("blocks") / request.param
    if request.param == "sliding":
        return str(make_sliding_model("qwen2", folder, 24, 5))
    random_model(tiny_config("llama", VOCAB, bos=0, eos=1), 3).save_pretrained(folder)
    write_wordlevel_tokenizer(folder)
    return str(folder)


def _run(model: str, **settings) -> tuple[Trace, int]:
    """A real run's trace, and the hit tokens its re-admissions after preemption found."""
    config = EngineConfig(
        model=model,
        device="cpu",
        dtype="float32",
        max_model_len=160,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        **settings,
    )
    engine = LLMEngine(config)
    again = [0]

    def count(event) -> None:
        if isinstance(event, SequenceAdmitted) and not event.first:
            again[0] += event.hit_tokens

    engine.observers.events.subscribe(count)
    for i, (prompt, params) in enumerate(_chats()):
        engine.add_request(f"chat{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    return engine.trace.trace(), again[0]


@pytest.fixture(scope="module")
def runs(model) -> dict[int, tuple[Trace, int]]:
    """A real run at each block size, over the same bytes of pool."""
    first, _ = _run(model, block_size=16, num_kv_blocks=POOL_BLOCKS_OF_16)
    pool = simulate(first).config.pool_bytes
    return {bs: _run(model, block_size=bs, kv_cache_memory=pool) for bs in BLOCK_SIZES}


@pytest.mark.parametrize("recorded_at", [16, 32])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_a_block_size_whatif_equals_a_real_run_at_that_block_size(runs, recorded_at, block_size):
    recorded, _ = runs[recorded_at]
    real, real_again = runs[block_size]
    result = simulate(recorded, WhatIf(block_size=block_size))
    assert result.config.num_blocks == real.settings.num_blocks
    assert [s.counts for s in result.steps] == [s.counts for s in real.steps]
    assert [s.shape for s in result.steps] == [s.shape for s in real.steps]
    mine, theirs = result.summary, recorded_summary(real)
    for name in FIGURES:
        assert getattr(mine, name) == getattr(theirs, name), name
    assert mine.recompute_hit_tokens == real_again
    assert theirs.preemptions > 0  # the pool was tight: the comparison covers preemption


def test_the_block_sizes_run_differently(runs):
    """The comparisons above are not of runs that all look alike."""
    peaks = {bs: recorded_summary(trace).peak_blocks_used for bs, (trace, _) in runs.items()}
    assert len(set(peaks.values())) == len(BLOCK_SIZES), peaks
    assert any(again for _, again in runs.values())  # some re-reads after preemption
