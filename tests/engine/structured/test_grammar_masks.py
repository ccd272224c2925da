"""The masks against llguidance's own matcher, the bit layout against plain arithmetic, and the
constraint's fields against vLLM's StructuredOutputsParams."""

import dataclasses

import llguidance
import pytest
import torch
import vllm_code

from kvscope.engine import ParamError, StructuredOutputsParams
from kvscope.engine.structured.compiler import GrammarCompiler
from kvscope.engine.structured.step_masks import StepMasks, bitmask_words, unpack_bitmask


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
        mask = StepMasks(lambda: compiler.mask_vocab_size).fill([(7, ours)])[7]
        expected = torch.frombuffer(bytearray(theirs.compute_bitmask()), dtype=torch.int32)
        assert torch.equal(mask, expected[: mask.numel()])


def test_unpacked_bits_name_the_allowed_tokens():
    vocab = 70
    allowed = sorted({0, 1, 31, 32, 33, 63, 64, 69})
    words = torch.zeros(1, bitmask_words(vocab), dtype=torch.int64)
    for t in allowed:
        words[0, t // 32] |= 1 << (t % 32)
    bitmask = words.to(torch.int32)  # bit 31 wraps to a negative int32, as llguidance writes it
    got = unpack_bitmask(bitmask, vocab)[0].nonzero().flatten().tolist()
    assert got == allowed
    # Logits wider than the tokenizer: the extra columns are never allowed.
    assert unpack_bitmask(bitmask, 100)[0, 70:].sum() == 0


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
