import dataclasses
import math

import pytest

from kvscope.engine.sampling_params import BeamSearchParams, ParamError, SamplingParams


def test_defaults_match_the_design_contract():
    p = SamplingParams()
    assert dataclasses.asdict(p) == {
        "max_tokens": 256,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "seed": None,
        "stop": [],
        "stop_token_ids": [],
        "ignore_eos": False,
        "n": 1,
        "logprobs": None,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": 0,
        "logit_bias": None,
        "allowed_token_ids": None,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
        "structured_outputs": None,
    }
    assert not p.greedy


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, []), ("###", ["###"]), (["a", "bc"], ["a", "bc"]), (("x",), ["x"])],
)
def test_stop_is_normalized_to_a_list(stop, expected):
    assert SamplingParams(stop=stop).stop == expected


def test_stop_token_ids_and_top_k_are_normalized():
    p = SamplingParams(stop_token_ids=(5, 0), top_k=0)
    assert p.stop_token_ids == [5, 0]
    assert p.top_k == -1


@pytest.mark.parametrize(("temperature", "greedy"), [(0.0, True), (1e-6, True), (1e-4, False)])
def test_greedy_means_temperature_near_zero(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", 2.5),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("top_k", 3.0),
        ("min_p", -0.1),
        ("min_p", 1.01),
        ("repetition_penalty", 0.0),
        ("seed", 1.5),
        ("seed", 2**64),
        ("stop", ""),
        ("stop", ["ok", ""]),
        ("stop", 7),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", 3),
        ("ignore_eos", 1),
        ("n", 0),
        ("logprobs", -1),
        ("logprobs", 21),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("frequency_penalty", math.nan),
        ("min_tokens", -1),
        ("min_tokens", 257),  # above max_tokens (256)
        ("min_tokens", True),
        ("logit_bias", [1, 2]),
        ("allowed_token_ids", [3, -1]),
        ("include_stop_str_in_output", "yes"),
        ("skip_special_tokens", None),
    ],
)
def test_bad_values_name_the_field_and_value(field, value):
    with pytest.raises(ParamError, match=field) as info:
        SamplingParams(**{field: value})
    assert repr(value) in str(info.value)
    assert info.value.param == field  # what the server's 400 names


@pytest.mark.parametrize(
    ("bias", "message"),
    [({-1: 1.0}, "keys must be token ids"), ({True: 1.0}, "keys"), ({5: math.inf}, "token 5")],
)
def test_logit_bias_names_the_bad_entry(bias, message):
    with pytest.raises(ParamError, match=message):
        SamplingParams(logit_bias=bias)


def test_allowed_token_ids_may_not_be_empty():
    with pytest.raises(ParamError, match="allowed_token_ids must not be empty"):
        SamplingParams(allowed_token_ids=[])


def test_token_ids_outside_the_vocabulary_are_refused():
    ok = SamplingParams(stop_token_ids=[9], logit_bias={9: 1.0}, allowed_token_ids=[0, 9])
    ok.check_vocab(10)
    for field, value in [
        ("stop_token_ids", [10]),
        ("logit_bias", {3: 1.0, 10: -1.0}),
        ("allowed_token_ids", [1, 12]),
    ]:
        with pytest.raises(ParamError, match=field) as info:
            SamplingParams(**{field: value}).check_vocab(10)
        assert info.value.param == field


def test_error_message_states_the_allowed_range():
    with pytest.raises(ValueError, match=r"top_p must be a finite number in \(0, 1\], got 2"):
        SamplingParams(top_p=2)


def test_beam_search_params_defaults_and_validation():
    b = BeamSearchParams()
    assert (b.beam_width, b.max_tokens, b.ignore_eos, b.length_penalty) == (4, 16, False, 1.0)
    for field, value in [("beam_width", 0), ("max_tokens", 0), ("length_penalty", math.nan)]:
        with pytest.raises(ValueError, match=field):
            BeamSearchParams(**{field: value})
