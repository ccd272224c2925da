"""A dropped engine frees its model and KV pool by reference counting alone.

The app's worker rebuilds the engine on its own thread, where it must not run gc.collect()
(app/desktop/engine_thread/host.py says why), and it freezes each engine it builds out of the cyclic
collector's reach. So anything of an old engine held in a reference cycle stays resident: the
fused CPU decode once held its model through a bound method, and every model switch kept the
previous model's weights and pool (RSS 1.11 GiB fresh on the bundled model, 3.25 GiB back on
it after two other models). These build each kind of model, generate, drop the engine with
the collector off, and check that the model and its pool are gone.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from tiny_gemma3 import make_tiny_gemma3, make_tiny_gemma3_gguf
from tiny_models import make_quant_gguf, make_tiny_gguf

from kvscope.engine import LLM, SamplingParams, StructuredOutputsParams


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("teardown")
    return {
        "quantized GGUF, bfloat16 (fused CPU decode)": (
            make_quant_gguf(folder / "q.gguf", "Q4_K"),
            {},
        ),
        "quantized GGUF, float32": (folder / "q.gguf", {"dtype": "float32"}),
        "float GGUF": (make_tiny_gguf("llama", folder / "f.gguf")[0], {}),
        "Gemma 3 GGUF": (make_tiny_gemma3_gguf(folder / "g.gguf"), {}),
        "Gemma 3 HF folder": (make_tiny_gemma3(folder / "g-hf"), {}),
    }


KINDS = [
    "quantized GGUF, bfloat16 (fused CPU decode)",
    "quantized GGUF, float32",
    "float GGUF",
    "Gemma 3 GGUF",
    "Gemma 3 HF folder",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_dropped_engine_frees_its_model_and_pool_without_the_collector(model_files, kind):
    path, knobs = model_files[kind]
    llm = LLM(model=str(path), device="cpu", kv_cache_memory=16 << 20, **knobs)
    # One of them constrained: its grammar, matchers and mask thread must not hold the engine.
    constrained = SamplingParams(
        max_tokens=6, temperature=0, structured_outputs=StructuredOutputsParams(regex="[a-z]{3,9}")
    )
    outputs = llm.generate(
        ["hi hi", "hello"], [SamplingParams(max_tokens=6, temperature=0), constrained]
    )
    assert all(o.outputs[0].token_ids for o in outputs)
    engine = llm.engine
    if kind.endswith("(fused CPU decode)"):  # the path that held the cycle: make sure it ran
        assert engine.model.fused_decode is not None
    held = {
        "engine": weakref.ref(engine),
        "model": weakref.ref(engine.model),
        "KV pool": weakref.ref(engine.kv_cache.data),
    }
    del engine
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del llm
        alive = [name for name, ref in held.items() if ref() is not None]
    finally:
        if was_enabled:
            gc.enable()
    assert alive == [], f"{kind}: still alive after the last reference went: {alive}"
