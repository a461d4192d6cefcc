"""SamplingParams normalizes stop lists and rejects out-of-range settings with ValueError."""
from __future__ import annotations

import pytest

from folovllm.sampling_params import SamplingParams


def test_defaults_follow_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1, 1.0, 1.0, -1, 0.0, 16)
    assert p.stop == [] and p.stop_token_ids == [] and not p.greedy


def test_stop_string_becomes_list() -> None:
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=["a", "b"]).stop == ["a", "b"]


def test_zero_temperature_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"output_kind": "delta"}, "output_kind"),
    ],
)
def test_rejects_bad_values(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_token_constraints_accept_vllm_forms() -> None:
    p = SamplingParams(logit_bias={5: -100, 6: 100.0}, allowed_token_ids=[3, 1, 3], bad_words=["a", "a", "b"],
                       truncate_prompt_tokens=-1)
    assert p.allowed_token_ids == [3, 1] and p.bad_words == ["a", "b"]  # repeats dropped, order kept
    assert SamplingParams().bad_words == [] and SamplingParams().logit_bias is None


def test_stop_strings_need_detokenize() -> None:
    assert SamplingParams(detokenize=False, stop_token_ids=[7]).stop_token_ids == [7]
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize=False, stop=["\n"])


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"min_p": float("nan")}, "min_p"),
    ({"presence_penalty": float("-inf")}, "presence_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"temperature": True}, "temperature"),
    ({"n": 2.0}, "n"),
    ({"max_tokens": True}, "max_tokens"),
    ({"seed": 2**64}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [2**63]}, "stop_token_ids"),
    ({"stop": [3]}, "stop"),
    ({"logit_bias": {1: 100.5}}, "logit_bias"),
    ({"logit_bias": {1: float("nan")}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {"1": 1.0}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [-3]}, "allowed_token_ids"),
    ({"allowed_token_ids": [True]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": [5]}, "bad_words"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": 1.5}, "truncate_prompt_tokens"),
])
def test_rejects_non_finite_and_mistyped_values(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)

