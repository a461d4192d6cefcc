"""The validation layer on its own: random request bodies give engine inputs or a 4xx, nothing else."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from folovllm.entrypoints.openai.errors import APIError
from folovllm.entrypoints.openai.protocol import CompletionRequest
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.validation import RequestLimits, Validator
from folovllm.sampling_params import SamplingParams

MAX_MODEL_LEN = 512

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_FIELDS = ["prompt", "messages", "n", "temperature", "top_p", "top_k", "min_p", "max_tokens",
           "max_completion_tokens", "min_tokens", "stop", "stop_token_ids", "seed", "logprobs",
           "top_logprobs", "echo", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "ignore_eos", "stream", "stream_options", "user", "priority", "cache_salt", "best_of",
           "logit_bias", "tools", "response_format", "suffix", "add_special_tokens", "prompt_logprobs",
           "allowed_token_ids", "bad_words", "truncate_prompt_tokens", "return_token_ids",
           "return_tokens_as_token_ids", "tool_choice", "chat_template", "chat_template_kwargs",
           "continue_final_message", "documents"]
plausible = st.one_of(
    json_values,
    st.integers(min_value=-3, max_value=700),
    st.floats(min_value=-3, max_value=3),
    st.lists(st.integers(min_value=-2, max_value=60000), max_size=6),
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                    "content": st.one_of(st.none(), st.text(max_size=20))}), max_size=3),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xFFFF), max_size=20),
)
bodies = st.dictionaries(st.sampled_from(_FIELDS), plausible, max_size=8)


@pytest.fixture(scope="module")
def validator(smol_tokenizer):
    return Validator(smol_tokenizer, MAX_MODEL_LEN, RequestLimits())


def _outcome(model, method, body: dict):
    """None when the body is turned away with a 4xx; the validated result otherwise."""
    try:
        request = model.model_validate(body)
    except ValidationError:
        return None  # the server's schema-error handler answers 400
    try:
        return method(request)
    except APIError as err:
        assert 400 <= err.status_code < 500, err.message
        assert err.message
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_random_completion_bodies_are_accepted_or_4xx(validator, body):
    result = _outcome(CompletionRequest, validator.completion, body)
    if result is not None:
        prompts, params = result
        assert isinstance(params, SamplingParams) and math.isfinite(params.temperature)
        for prompt in prompts:
            n = len(prompt["prompt_token_ids"])
            assert 0 < n < MAX_MODEL_LEN
            assert params.max_tokens is None or n + params.max_tokens <= MAX_MODEL_LEN


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_random_chat_bodies_are_accepted_or_4xx(validator, body):
    result = _outcome(ChatCompletionRequest, validator.chat, body)
    if result is not None:
        prompt, params, _ = result
        assert 0 < len(prompt["prompt_token_ids"]) < MAX_MODEL_LEN


def test_unimplemented_field_is_named(validator):
    body = CompletionRequest.model_validate({"prompt": "Hi", "suffix": "!"})
    with pytest.raises(APIError) as info:
        validator.completion(body)
    assert info.value.param == "suffix" and "not supported" in info.value.message


def test_token_constraints_reach_the_sampling_params(validator):
    body = CompletionRequest.model_validate({"prompt": "Hi", "logit_bias": {"5": -100, "0007": 2.5},
                                             "allowed_token_ids": [5, 7, 5], "bad_words": ["x"]})
    _, params = validator.completion(body)
    assert params.logit_bias == {5: -100, 7: 2.5} and params.allowed_token_ids == [5, 7]
    assert params.bad_words == ["x"]
    for bias, words in [({"x1": 1}, "logit_bias must be keyed by token ids"),
                        ({"1": -101}, "logit_bias must be biases in [-100, 100]")]:
        with pytest.raises(APIError) as info:
            validator.completion(CompletionRequest.model_validate({"prompt": "Hi", "logit_bias": bias}))
        assert info.value.param == "logit_bias" and words in info.value.message


def test_truncate_prompt_tokens_keeps_the_last_tokens(validator, smol_tokenizer):
    text = "one two three four five six"
    ids = smol_tokenizer.encode(text)
    for prompt in (text, ids):
        prompts, params = validator.completion(CompletionRequest.model_validate(
            {"prompt": prompt, "truncate_prompt_tokens": 2}))
        # a truncated text is dropped: an echo shows the tokens the model saw
        assert prompts == [{"prompt_token_ids": ids[-2:]}] and params.truncate_prompt_tokens == 2
    whole, _ = validator.completion(CompletionRequest.model_validate(
        {"prompt": text, "truncate_prompt_tokens": -1}))
    assert whole == [{"prompt": text, "prompt_token_ids": ids}]
    prompt, _, _ = validator.chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": text}], "truncate_prompt_tokens": 3}))
    assert len(prompt["prompt_token_ids"]) == 3
    with pytest.raises(APIError) as info:
        validator.completion(CompletionRequest.model_validate({"prompt": text, "truncate_prompt_tokens": 513}))
    assert info.value.param == "truncate_prompt_tokens" and "max_model_len=512" in info.value.message


def test_noop_values_of_unimplemented_fields_pass(validator):
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Hi"}], "tools": [], "tool_choice": "none",
        "logit_bias": {}, "response_format": {"type": "text"}, "best_of": 1, "metadata": {"a": "b"}})
    prompt, params, _ = validator.chat(body)
    assert prompt["prompt_token_ids"]


def test_renamed_parameters_in_messages(validator):
    for field, value, words in [("max_completion_tokens", 0, "max_completion_tokens must be at least 1"),
                                ("top_logprobs", 21, "top_logprobs must be in [0, 20]")]:
        body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}],
                                                     "logprobs": True, field: value})
        with pytest.raises(APIError) as info:
            validator.chat(body)
        assert info.value.param == field and words in info.value.message


def test_max_tokens_must_fit_the_context(validator):
    body = CompletionRequest.model_validate({"prompt": "Hi there", "max_tokens": MAX_MODEL_LEN})
    with pytest.raises(APIError) as info:
        validator.completion(body)
    assert info.value.param == "max_tokens" and "maximum context length is 512" in info.value.message


def test_cache_salt_reaches_the_engine_inputs(validator):
    prompts, _ = validator.completion(CompletionRequest.model_validate({"prompt": ["a", "b"], "cache_salt": "t1"}))
    assert [p["cache_salt"] for p in prompts] == ["t1", "t1"]
    prompt, _, _ = validator.chat(ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Hi"}], "cache_salt": "t2"}))
    assert prompt["cache_salt"] == "t2"


def test_text_longer_than_the_context_is_not_tokenized(validator, monkeypatch):
    monkeypatch.setattr(validator.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    with pytest.raises(APIError, match="characters"):
        validator.encode("x" * (validator.max_prompt_chars + 1), True, "prompt")


def test_limits_reject_nonpositive_values():
    with pytest.raises(ValueError, match="--max-n"):
        RequestLimits(max_n=0)


def test_scoring_bodies_reach_the_engine_with_prompt_logprobs(validator):
    # lm-eval's loglikelihood request: echo the prompt with logprobs, generate nothing
    _, params = validator.completion(CompletionRequest.model_validate(
        {"prompt": "Hi there", "echo": True, "logprobs": 1, "max_tokens": 0}))
    assert params.prompt_logprobs == 1 and params.logprobs == 1 and params.max_tokens == 1
    _, params = validator.completion(CompletionRequest.model_validate(
        {"prompt": "Hi there", "echo": True, "logprobs": 0, "max_tokens": 0, "prompt_logprobs": 3}))
    assert params.prompt_logprobs == 3
    _, params = validator.completion(CompletionRequest.model_validate({"prompt": "Hi", "logprobs": 2}))
    assert params.prompt_logprobs is None  # without echo only the generated tokens get logprobs
    _, params, _ = validator.chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 0}))
    assert params.prompt_logprobs == 0


def test_max_tokens_zero_needs_echo(validator):
    with pytest.raises(APIError) as info:
        validator.completion(CompletionRequest.model_validate({"prompt": "Hi", "max_tokens": 0}))
    assert info.value.param == "max_tokens" and "only with echo" in info.value.message


def test_generation_config_defaults_fill_only_omitted_fields(smol_tokenizer):
    validator = Validator(smol_tokenizer, MAX_MODEL_LEN, RequestLimits(),
                          default_sampling={"temperature": 0.3, "top_k": 40, "max_tokens": 7})
    messages = [{"role": "user", "content": "hi"}]
    _, params, _ = validator.chat(ChatCompletionRequest.model_validate({"messages": messages}))
    assert (params.temperature, params.top_k, params.max_tokens) == (0.3, 40, 7)
    _, params, _ = validator.chat(ChatCompletionRequest.model_validate(
        {"messages": messages, "temperature": 1.0, "top_k": 5, "max_tokens": 9}))
    assert (params.temperature, params.top_k, params.max_tokens) == (1.0, 5, 9)
    _, params = validator.completion(CompletionRequest.model_validate({"prompt": "hi"}))
    assert params.temperature == 0.3 and params.max_tokens == 16  # completions' own default stays
