"""The masks against llguidance's own matcher, the bit layout against plain arithmetic, and the
constraint's fields against vLLM's StructuredOutputsParams."""

import dataclasses

import llguidance
import numpy as np
import pytest
import torch
import vllm_code

from kvscope.engine import ParamError, StructuredOutputsParams
from kvscope.engine.structured.compiler import GrammarCompiler
from kvscope.engine.structured.step_masks import (
    StepMasks,
    bitmask_words,
    token_masks,
)


@pytest.fixture(scope="module")
def compiler(default_model_lazy):
    tokenizer = default_model_lazy.tokenizer
    return GrammarCompiler(tokenizer, default_model_lazy.config.vocab_size, [2])


def test_step_masks_are_the_matchers_own_bitmask(compiler, default_model_lazy):
    tokenizer = default_model_lazy.tokenizer
    params = StructuredOutputsParams(
        json={"type": "object", "properties": {"a": {"type": "integer"}}}
    )
    ours = compiler.compile(params).matcher()
    theirs = llguidance.LLMatcher(compiler.tokenizer, params.grammar_text(), log_level=0)
    for text in ("", '{"', 'a":', "12"):
        for token in tokenizer.encode(text, add_special_tokens=False):
            assert ours.accept(token) and theirs.consume_token(token)
        columns = default_model_lazy.config.vocab_size
        mask = StepMasks(lambda: compiler.mask_vocab_size, columns).fill([(7, ours)])[7]
        expected = torch.frombuffer(bytearray(theirs.compute_bitmask()), dtype=torch.int32)
        assert torch.equal(mask.bitmask, expected[: mask.bitmask.numel()])
        # the row the sampler adds: 0 on the allowed tokens, -inf on every other
        allowed = unpack_bitmask(mask.bitmask[None], columns)[0]
        assert torch.equal(mask.additive == 0, allowed)
        assert torch.isneginf(mask.additive[~allowed]).all()
        assert mask.allows_any == bool(allowed.any())


def test_mask_rows_name_the_allowed_tokens():
    vocab = 70
    allowed = sorted({0, 1, 31, 32, 33, 63, 64, 69})
    words = torch.zeros(1, bitmask_words(vocab), dtype=torch.int64)
    for t in allowed:
        words[0, t // 32] |= 1 << (t % 32)
    bitmask = words.to(torch.int32)  # bit 31 wraps to a negative int32, as llguidance writes it
    row = token_masks(bitmask, vocab)[0].additive
    assert (row == 0).nonzero().flatten().tolist() == allowed
    assert torch.isneginf(row).sum() == vocab - len(allowed)
    # Logits wider than the tokenizer: the extra columns are never allowed.
    assert torch.isneginf(token_masks(bitmask, 100)[0].additive[70:]).all()


def unpack_bitmask(bitmask: torch.Tensor, columns: int) -> torch.Tensor:
    """The reference: [rows, words] int32 -> [rows, columns] bool by plain shifts, bit i of
    word w = token 32w+i; columns past the words are never allowed."""
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()
    if allowed.shape[1] < columns:
        allowed = torch.nn.functional.pad(allowed, (0, columns - allowed.shape[1]))
    return allowed[:, :columns]


def test_the_compiled_grammar_is_cached_by_its_text(compiler):
    a = compiler.compile(StructuredOutputsParams(regex="[ab]+"))
    b = compiler.compile(StructuredOutputsParams(regex="[ab]+"))
    assert a is b
    assert compiler.compile(StructuredOutputsParams(regex="[abc]+")) is not a


@pytest.mark.parametrize(
    "fields",
    [{}, {"json": {}, "regex": "a"}, {"choice": []}, {"json_object": False}, {"regex": ""}],
)
def test_exactly_one_usable_constraint(fields):
    with pytest.raises(ParamError) as e:
        StructuredOutputsParams(**fields)
    assert e.value.param == "structured_outputs"


def test_the_fields_are_vllms():
    theirs = vllm_code.module("vllm.sampling_params").StructuredOutputsParams
    names = {f.name for f in dataclasses.fields(theirs) if not f.name.startswith("_")}
    assert {f.name for f in dataclasses.fields(StructuredOutputsParams)} == names


def test_listed_objects_are_closed_as_xgrammar_strict_mode_does():
    params = StructuredOutputsParams(
        json={
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {}},
                "b": {"type": "object", "properties": {}, "additionalProperties": True},
            },
        }
    )
    assert params.grammar_text().count('"additionalProperties":false') == 2
    assert params.grammar_text().count('"additionalProperties":true') == 1


def test_token_masks_agree_with_the_unpacked_bits_at_any_width():
    """The sampler's rows and the allows-any flag (read from whole words) against the bits,
    for logits narrower and wider than the bitmask and rows allowing one token or none."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        words = int(torch.randint(1, 8, (1,), generator=g))
        allowed = torch.rand(5, words * 32, generator=g) < 0.02
        allowed[0] = False
        allowed[1] = False
        allowed[1, int(torch.randint(0, words * 32, (1,), generator=g))] = True
        packed = np.packbits(allowed.numpy(), axis=1, bitorder="little").view(np.int32).copy()
        columns = int(torch.randint(1, words * 32 + 40, (1,), generator=g))
        want = unpack_bitmask(torch.from_numpy(packed), columns)
        for row, mask in enumerate(token_masks(torch.from_numpy(packed), columns)):
            assert torch.equal(mask.additive == 0, want[row])
            assert mask.allows_any == bool(want[row].any())
