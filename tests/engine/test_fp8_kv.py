"""fp8 (e4m3) KV cache on the bundled model: pool size, calibrated scales, greedy agreement."""

import pytest
import torch

from kvscope.engine import LLM, EngineConfig, SamplingParams
from kvscope.engine.kv.kv_cache import KVCache


@pytest.fixture(scope="module")
def fp16_block_bytes(default_model):
    mc = default_model.config
    return KVCache.bytes_per_block(mc.num_layers, 16, mc.num_kv_heads, mc.head_dim, torch.float16)


@pytest.fixture(scope="module")
def fp8_llm(default_model, fp16_block_bytes):
    return LLM(
        model=default_model,
        device="cpu",
        dtype="float32",
        kv_cache_dtype="fp8",
        kv_cache_memory=300 * fp16_block_bytes,
    )


def test_config_knows_fp8():
    assert EngineConfig(kv_cache_dtype="fp8").kv_torch_dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="fp8"):
        EngineConfig(kv_cache_dtype="int4")


def test_fp8_pool_holds_twice_the_blocks_of_float16(default_model, fp8_llm, fp16_block_bytes):
    fp16 = LLM(
        model=default_model,
        device="cpu",
        dtype="float32",
        kv_cache_dtype="float16",
        kv_cache_memory=300 * fp16_block_bytes,
    )
    assert fp16.stats()["kv_blocks_total"] == 300
    assert fp8_llm.stats()["kv_blocks_total"] == 600
    assert fp8_llm.engine.kv_cache.data.dtype == torch.float8_e4m3fn
    assert fp8_llm.engine.kv_cache.data.element_size() == 1
    # Same bytes, give or take the scales (one float per layer, K/V and KV head).
    assert fp8_llm.stats()["kv_cache_bytes"] - fp16.stats()["kv_cache_bytes"] == 30 * 2 * 3 * 4


def test_scales_are_calibrated_per_layer_and_kv_head(fp8_llm):
    cache = fp8_llm.engine.kv_cache
    scales = cache.scales
    assert scales.shape == (30, 2, 3) and scales.dtype == torch.float32
    assert (scales > 0).all() and not torch.equal(scales, torch.ones_like(scales))
    # Heads of one layer get scales of their own: K amax differs between heads by design.
    assert (scales.amax(-1) / scales.amin(-1)).max() > 1.5
    k_scale, v_scale = cache.layer_scales(7)
    assert k_scale.shape == (3,) and torch.equal(v_scale, scales[7, 1])


def test_copy_on_write_copies_fp8_blocks_bytewise():
    cache = KVCache(2, 4, 8, 1, 16, torch.float8_e4m3fn, torch.device("cpu"))
    cache.data[:, :, 1] = torch.linspace(-3, 3, 8 * 16).view(8, 1, 16).to(torch.float8_e4m3fn)
    cache.copy_blocks([(1, 3)])
    assert torch.equal(cache.data[:, :, 3].view(torch.uint8), cache.data[:, :, 1].view(torch.uint8))


@pytest.mark.slow
def test_fp8_greedy_tokens_agree_with_full_precision(default_llm, fp8_llm, chat_prompts):
    """First greedy token on >= 90% of the chat prompts. The first 16 prompts also run 32 tokens,
    whose agreement is printed (greedy paths part for good at the first differing token)."""
    chats = [[{"role": "user", "content": p}] for p in chat_prompts]
    long = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    params = [long] * 16 + [SamplingParams(max_tokens=1, temperature=0.0)] * (len(chats) - 16)
    ref = [o.outputs[0].token_ids for o in default_llm.chat(chats, params)]
    fp8 = [o.outputs[0].token_ids for o in fp8_llm.chat(chats, params)]
    first = sum(a[0] == b[0] for a, b in zip(ref, fp8, strict=True)) / len(chats)
    pairs = list(zip(ref[:16], fp8[:16], strict=True))
    same = sum(a == b for a, b in pairs) / 16
    prefix = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), 32) for a, b in pairs
    ]
    positions = sum(x == y for a, b in pairs for x, y in zip(a, b, strict=True)) / (32 * 16)
    print(
        f"\nfp8 KV vs float32 KV, greedy: first token {100 * first:.1f}% of {len(chats)} chat "
        f"prompts; over 32 tokens of the first 16: all identical {100 * same:.1f}%, mean agreeing "
        f"prefix {sum(prefix) / 16:.1f} tokens, same token at same position {100 * positions:.1f}%"
    )
    assert first >= 0.9
