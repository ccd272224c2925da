"""EngineConfig's fields are the one list of engine knobs; LLM's signature is derived from them."""

import inspect
from dataclasses import fields

import pytest

from kvscope.engine import LLM, EngineConfig
from kvscope.engine.config import KNOB, knob_of, user_knobs

# The public contract: derived from the fields, so reordering or renaming one changes it.
LLM_SIGNATURE = (
    "(model=None, device='auto', dtype='auto', kv_cache_dtype='auto', block_size=16, "
    "num_kv_blocks=None, kv_cache_memory=None, gpu_memory_utilization=0.9, max_model_len=None, "
    "max_num_seqs=64, max_num_batched_tokens=None, enable_prefix_caching=True, "
    "allocator='paged', seed=0, quantization='auto', num_threads=None, "
    "cpu_quant_kernel='auto')"
)


def test_llm_takes_every_user_knob_with_its_default():
    params = inspect.signature(LLM).parameters.values()
    assert [(p.name, p.default) for p in params] == [(f.name, f.default) for f in user_knobs()]
    unannotated = inspect.signature(LLM).replace(
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in params],
        return_annotation=inspect.Signature.empty,
    )
    assert str(unannotated) == LLM_SIGNATURE
    assert inspect.signature(LLM).parameters["block_size"].annotation == "int"


def test_the_engines_own_fields_are_no_llm_arguments():
    internal = [f.name for f in fields(EngineConfig) if not f.metadata[KNOB].user]
    assert internal == ["weights_quantized", "release_window_blocks"]
    with pytest.raises(TypeError, match="weights_quantized"):
        LLM(weights_quantized=True)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((), {"blok_size": 8}, "unexpected keyword argument 'blok_size'"),
        ((None,), {"model": None}, "multiple values for argument 'model'"),
        ((None,) * (len(user_knobs()) + 1), {}, "too many positional arguments"),
    ],
)
def test_a_bad_llm_argument_is_a_type_error_naming_it(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        LLM(*args, **kwargs)


def test_llm_takes_knobs_positionally_as_its_signature_says(default_model):
    llm = LLM(default_model, "cpu", "float32", "auto", 32, 12)
    assert llm.config.model == default_model.source
    assert (llm.config.device, llm.config.block_size, llm.config.num_kv_blocks) == ("cpu", 32, 12)
    assert llm.stats()["kv_block_size"] == 32


@pytest.mark.parametrize("name", [f.name for f in user_knobs() if f.metadata[KNOB].choices])
def test_a_value_outside_a_knobs_choices_is_refused_naming_both(name):
    with pytest.raises(ValueError, match=f"{name} 'bogus' is not one of"):
        EngineConfig(device="cpu", **{name: "bogus"})
    for choice in knob_of(name).choices:
        assert getattr(EngineConfig(device="cpu", **{name: choice}), name) == choice


def test_every_knob_has_help_text_argparse_can_print():
    for f in fields(EngineConfig):
        assert f.metadata[KNOB].help and "%" not in f.metadata[KNOB].help
