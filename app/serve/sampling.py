"""What a request's fields ask of the engine, read as vLLM 0.33's OpenAI server reads them (its
`to_sampling_params` and its SamplingParams checks): the engine's
SamplingParams, and a 400 naming the field for what the engine cannot honour
(app/serve/protocol.py lists both). truncate_prompt_tokens: app/serve/truncation.py."""

from __future__ import annotations

from kvscope.app.serve.errors import APIError
from kvscope.app.serve.protocol import SamplingFields, refused_field
from kvscope.app.serve.state import ServerState
from kvscope.engine import (
    GREEDY_TEMPERATURE,
    ParamError,
    SamplingParams,
    StructuredOutputsParams,
)

# vLLM raises a temperature in (0, 0.01) to 0.01 (numerical safety): such a request samples.
MIN_TEMPERATURE = 1e-2
MAX_LOGIT_BIAS = 100.0  # vLLM clamps every bias into [-100, 100]


def refuse_unsupported(body: SamplingFields, refused: dict[str, tuple]) -> None:
    name = refused_field(body, refused)
    if name is not None:
        value = repr((body.model_extra or {})[name])[:80]  # refused_field found it there
        raise APIError(400, f"{name} is not supported by this server (got {value})", name)
    best_of = (body.model_extra or {}).get("best_of")
    if best_of is not None and not (type(best_of) is int and best_of == body.n):
        raise APIError(
            400,
            f"best_of is not supported by this server (got {repr(best_of)[:80]}, n={body.n}): "
            "vLLM 0.33 dropped it too; ask for n candidates and compare their logprobs",
            "best_of",
        )


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if raw is None:
        return None
    try:
        keys = [int(token) for token in raw]  # JSON keys are strings: vLLM's int(token)
    except ValueError:
        raise APIError(
            400, "logit_bias keys must be token ids (integers as strings)", "logit_bias"
        ) from None
    # vLLM's clamp, written as it writes it (NaN becomes -100 the same way).
    return {
        k: min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, bias))
        for k, bias in zip(keys, raw.values(), strict=True)
    }


def sampling_params(
    state: ServerState,
    body: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """The engine's SamplingParams for a request, or an APIError(400) naming the bad field."""
    limit = state.max_model_len
    if max_tokens is not None and max_tokens > limit:
        raise APIError(
            400,
            f"max_tokens {max_tokens} exceeds the context length: must be <= {limit}",
            "max_tokens",
        )
    skip_special = body.skip_special_tokens is not False
    if not skip_special and not body.spaces_between_special_tokens:
        # Shown special tokens: vLLM strips the spaces a tokenizer puts between them; ours
        # decode with the tokenizer's own spacing, so this output would differ.
        raise APIError(
            400,
            "spaces_between_special_tokens: false is not supported with skip_special_tokens: false",
            "spaces_between_special_tokens",
        )
    temperature = 1.0 if body.temperature is None else body.temperature
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    if body.n > 1 and temperature < GREEDY_TEMPERATURE:
        raise APIError(400, f"n must be 1 when using greedy sampling, got {body.n}", "n")
    try:
        params = SamplingParams(
            max_tokens=max_tokens or limit,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k,
            min_p=0.0 if body.min_p is None else body.min_p,
            repetition_penalty=(
                1.0 if body.repetition_penalty is None else body.repetition_penalty
            ),
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            n=body.n,
            stop=body.stop,
            stop_token_ids=body.stop_token_ids,
            seed=None if body.seed == -1 else body.seed,  # vLLM: -1 means no seed
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            logprobs=logprobs,
            logit_bias=_logit_bias(body.logit_bias),
            allowed_token_ids=body.allowed_token_ids,
            include_stop_str_in_output=body.include_stop_str_in_output,
            skip_special_tokens=skip_special,
            structured_outputs=structured_outputs,
        )
        params.check_vocab(state.engine.model_config.vocab_size)
    except ParamError as e:
        raise APIError(400, str(e), e.param) from None
    return params
