"""The block map on a sliding-window model: the caption counts full and sliding blocks and the
blocks released as the window slid, the hover card names a block's KV group."""

import pytest
from sliding_models import make_sliding_model

from kvscope.app.desktop.blockmap.captions import paged_caption
from kvscope.app.desktop.blockmap.kv_groups import groups_text
from kvscope.app.desktop.blockmap.tooltip import block_owners, describe_block
from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.kv.snapshot import BlockState


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """Snapshots of a Qwen2 (layer 0 full, layer 1 sliding by 16) streaming one long reply."""
    folder = make_sliding_model("qwen2", tmp_path_factory.mktemp("map") / "q", 16, seed=5)
    engine = LLMEngine(
        EngineConfig(
            model=str(folder), device="cpu", dtype="float32", block_size=8, num_kv_blocks=80
        )
    )
    engine.add_request(
        "conv-1/r1", list(range(5, 25)), SamplingParams(max_tokens=40, ignore_eos=True)
    )
    snaps = []
    while engine.has_unfinished_requests():
        engine.step()
        snaps.append(engine.kv_snapshot())
    return snaps[:-1]  # the last step frees the sequence


def test_caption_shows_sliding_blocks_flat_and_released_climbing(streamed):
    first, last = streamed[0], streamed[-1]
    assert first.group_windows == (None, 16)
    full_last, sliding_last = last.metrics.group_blocks_used
    full_table, sliding_table = last.sequences[0].group_tables
    assert full_last == len(full_table) >= 7  # every block of the full layer stays
    assert sliding_last == sum(b >= 0 for b in sliding_table) <= -(-15 // 8) + 1
    assert last.metrics.blocks_released > first.metrics.blocks_released
    text = groups_text(last)
    assert f"{full_last} full-attention + {sliding_last} sliding (16-token window)" in text
    assert f"{last.metrics.blocks_released} released" in text
    assert text in paged_caption(last)


def test_hover_card_names_the_group_and_its_logical_index(streamed):
    snap = streamed[-1]
    seq = snap.sequences[0]
    assert seq.group_tables and len(seq.group_tables) == 2
    full_table, sliding_table = seq.group_tables
    assert sliding_table[0] == -1  # released, as the window moved on
    block = sliding_table[-1]
    assert snap.state[block] == BlockState.USED and snap.group[block] == 1
    card = describe_block(snap, block)
    assert "KV group 1 (sliding, 16-token window)" in card
    assert block_owners(snap, block) == [(seq.request_id, seq.seq_id, len(sliding_table) - 1)]
    assert "KV group 0 (full attention)" in describe_block(snap, full_table[0])
