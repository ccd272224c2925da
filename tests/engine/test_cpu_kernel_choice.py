"""EngineConfig's cpu_quant_kernel: "torch" builds a quantized CPU engine on torch's kernels with
nothing compiled (what the app answers with while numba compiles), and it answers as numba's do."""

import os
import subprocess
import sys
import textwrap

import pytest
from tiny_models import make_quant_gguf

from kvscope.engine import LLM, SamplingParams
from kvscope.kernels import cpu_gemv


def test_the_torch_kernels_compile_nothing(tmp_path):
    """In a fresh process with an empty numba cache: the engine builds and answers, numba is
    never imported and nothing is written to its cache."""
    cache = tmp_path / "numba"
    model = make_quant_gguf(tmp_path / "q4_0.gguf", "Q4_0")
    script = textwrap.dedent(
        f"""
        import sys
        from kvscope.engine import LLM, SamplingParams
        from kvscope.engine.model.loader import load_model
        llm = LLM(model=load_model({str(model)!r}), device="cpu", num_kv_blocks=16,
                  cpu_quant_kernel="torch")
        out = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=3))
        assert len(out[0].outputs[0].token_ids) == 3
        print(llm.stats()["weight_layout"], "numba" in sys.modules)
        """
    )
    env = {"KVSCOPE_NUMBA_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["cpu-int4", "False"]
    assert not cache.exists() or not any(cache.rglob("*.nbi"))


def test_the_torch_path_answers_as_the_numba_path(default_model_lazy, chat_prompts):
    """The bundled model, greedy, teacher-forced on numba's reply: at every position torch's
    kernels pick numba's token, or one within 0.5 nats of it where the two nearly tie (the
    paths round activations differently: bfloat16 against int8 per 32)."""
    if cpu_gemv.load() is None:
        pytest.skip("numba's kernels do not compile here")
    kw = dict(model=default_model_lazy, device="cpu", num_kv_blocks=64)
    numba, torch_path = LLM(**kw), LLM(**kw, cpu_quant_kernel="torch")
    assert numba.stats()["weight_layout"] == "cpu-gemv"
    assert torch_path.stats()["weight_layout"] == "cpu-int4"
    exact = gaps = 0
    for text in chat_prompts[:1]:
        prompt = numba.engine.apply_chat_template([{"role": "user", "content": text}])
        prompt_ids = numba.engine.tokenize(prompt)[1]
        reply = numba.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=12))
        tokens = reply[0].outputs[0].token_ids
        for i, token in enumerate(tokens):
            step = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
            out = torch_path.generate([list(prompt_ids) + list(tokens[:i])], step)[0].outputs[0]
            top = {t: _logprob(v) for t, v in out.logprobs[0].items()}
            assert token in top, (i, token, top)
            assert max(top.values()) - top[token] < 0.5, (i, token, top)
            exact += out.token_ids[0] == token
            gaps += 1
    assert exact >= 0.9 * gaps, f"{exact} of {gaps} positions agree"


def _logprob(value) -> float:
    return value if isinstance(value, float) else value.logprob


def test_a_bad_choice_is_refused_naming_it():
    with pytest.raises(ValueError, match="cpu_quant_kernel 'numba' is not one of"):
        LLM(device="cpu", cpu_quant_kernel="numba")
