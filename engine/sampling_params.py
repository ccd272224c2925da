"""What a request asks of generation: SamplingParams and BeamSearchParams, validated once here."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from kvscope.engine.param_error import ParamError

if TYPE_CHECKING:
    from kvscope.engine.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
# torch.Generator.manual_seed accepts exactly this range; checking here keeps a bad seed from
# failing later, inside an engine step.
SEED_RANGE = (-(2**63), 2**64 - 1)
GREEDY_TEMPERATURE = 1e-5


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but max_tokens=True is a bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ParamError(name, f"{name} must be an int {allowed}, got {reprlib.repr(value)}")


def _check_number(name: str, value: object, ok: Callable[[float], bool], allowed: str) -> None:
    is_number = _is_int(value) or isinstance(value, float)
    got = reprlib.repr(value)  # a 5,000-digit int from a file or a request, cut short
    if not is_number or not isinstance(value, (int, float)):  # the second narrows for mypy
        raise ParamError(name, f"{name} must be a finite number {allowed}, got {got}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past float's range: JSON holds one, a settings file did
        finite = False
    if not finite or not ok(value):
        raise ParamError(name, f"{name} must be a finite number {allowed}, got {got}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ParamError(name, f"{name} must be True or False, got {value!r}")


def _stop_list(value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if items is None:
        return []
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise ParamError(
            "stop", f"stop must be None, a non-empty str or a list of them, got {value!r}"
        )
    return list(items)


def _token_id_list(name: str, value: object) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in value):
        raise ParamError(name, f"{name} must be None or a list of ints >= 0, got {value!r}")
    return list(value)


def _logit_bias(value: object) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParamError("logit_bias", f"logit_bias must be None or a dict, got {value!r}")
    for token, bias in value.items():
        if not _is_int(token) or token < 0:
            raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {token!r}")
        _check_number("logit_bias", bias, lambda v: True, f"(the bias of token {token})")
    return {token: float(bias) for token, bias in value.items()}


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0, normalized to -1) disables top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None  # normalized to a list, [] when None
    stop_token_ids: list[int] | None = None  # normalized to a list, [] when None
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None  # top raw logprobs per token; 0 = the sampled token only
    # The rest as vLLM's SamplingParams defines them (its own code is the reference:
    # tests/app/serve/test_vllm_sampling.py).
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence among the generated tokens
    min_tokens: int = 0  # EOS and stop_token_ids are masked, stop strings unchecked, until then
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    allowed_token_ids: list[int] | None = None  # only these may be sampled (non-empty)
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text)
    skip_special_tokens: bool = True  # in the output text
    # The grammar every sampled token must follow (JSON Schema, regex, choice, Lark).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 1)
        _check_number("temperature", self.temperature, lambda v: v >= 0, ">= 0")
        _check_number("top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ParamError(
                "top_k", f"top_k must be -1 or 0 (disabled) or an int >= 1, got {self.top_k!r}"
            )
        if self.top_k == 0:
            self.top_k = -1
        _check_number("min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1]")
        _check_number("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0")
        if self.seed is not None:
            _check_int("seed", self.seed, *SEED_RANGE)
        self.stop = _stop_list(self.stop)
        self.stop_token_ids = _token_id_list("stop_token_ids", self.stop_token_ids)
        _check_bool("ignore_eos", self.ignore_eos)
        _check_int("n", self.n, 1)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), lambda v: -2 <= v <= 2, "in [-2, 2]")
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        self.logit_bias = _logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_id_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ParamError("allowed_token_ids", "allowed_token_ids must not be empty")
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        _check_bool("skip_special_tokens", self.skip_special_tokens)
        if self.structured_outputs is not None:
            from kvscope.engine.structured.params import StructuredOutputsParams

            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ParamError(
                    "structured_outputs",
                    "structured_outputs must be a StructuredOutputsParams, got "
                    f"{type(self.structured_outputs).__name__}",
                )

    def check_vocab(self, vocab_size: int) -> None:
        """Every token id the parameters name must have a logit (as vLLM's verify checks)."""
        named = {
            "stop_token_ids": self.stop_token_ids or [],
            "logit_bias": list(self.logit_bias or ()),
            "allowed_token_ids": self.allowed_token_ids or [],
        }
        for name, ids in named.items():
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ParamError(
                    name, f"{name} has token ids {bad[:5]} outside the vocabulary [0, {vocab_size})"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


@dataclass
class BeamSearchParams:
    beam_width: int = 4
    max_tokens: int = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0  # beams rank by cum_logprob / length ** length_penalty

    def __post_init__(self) -> None:
        _check_int("beam_width", self.beam_width, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_bool("ignore_eos", self.ignore_eos)
        _check_number("length_penalty", self.length_penalty, lambda v: True, "of any sign")
