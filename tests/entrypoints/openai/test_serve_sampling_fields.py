"""logit_bias, allowed_token_ids, bad_words, truncate_prompt_tokens, return_token_ids,
return_tokens_as_token_ids and continuous usage stats, through the official openai client."""
from __future__ import annotations

import openai
import pytest

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def _complete(client, **extra):
    return client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True, **extra})


def test_neutral_fields_leave_greedy_output_unchanged(client):
    plain = _complete(client)
    neutral = _complete(client, logit_bias={}, allowed_token_ids=list(range(49152)), bad_words=["zzqqxx"],
                        truncate_prompt_tokens=-1)
    assert neutral.choices[0].text == plain.choices[0].text
    assert neutral.usage == plain.usage


def test_logit_bias_allowed_token_ids_and_bad_words(client):
    plain = _complete(client, return_token_ids=True).choices[0]
    assert "Paris" in plain.text
    forced = _complete(client, logit_bias={"42": 100}, return_token_ids=True).choices[0]
    assert forced.token_ids == [42] * 5
    banned = _complete(client, logit_bias={str(plain.token_ids[0]): -100}, return_token_ids=True).choices[0]
    assert banned.token_ids[0] != plain.token_ids[0]
    allowed = [11, 12, 13]
    sampled = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=1,
                                        extra_body={"allowed_token_ids": allowed, "return_token_ids": True})
    assert set(sampled.choices[0].token_ids) <= set(allowed)
    assert "Paris" not in _complete(client, bad_words=["Paris"]).choices[0].text
    chat = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=3, temperature=0,
                                          logit_bias={"42": 100}, extra_body={"return_token_ids": True})
    assert chat.choices[0].token_ids == [42] * 3


def test_truncate_prompt_tokens_counts_in_usage_and_echo(client, http):
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    response = _complete(client, truncate_prompt_tokens=2, echo=True, return_token_ids=True)
    choice = response.choices[0]
    assert response.usage.prompt_tokens == 2 and choice.prompt_token_ids == ids[-2:]
    tail = http.post("/detokenize", json={"tokens": ids[-2:]}).json()["prompt"]
    assert choice.text.startswith(tail) and not choice.text.startswith(PROMPT)
    chat = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2, temperature=0,
                                          extra_body={"truncate_prompt_tokens": 4})
    assert chat.usage.prompt_tokens == 4


def test_return_token_ids_and_tokens_as_token_ids(client):
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2,
                                         extra_body=extra)
    choice = response.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
    assert all(key.startswith("token_id:") for top in choice.logprobs.top_logprobs for key in top)
    assert len(choice.prompt_token_ids) == response.usage.prompt_tokens
    chat = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=3, temperature=0,
                                          logprobs=True, top_logprobs=1, extra_body=extra)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in chat.choices[0].token_ids]
    assert len(chat.prompt_token_ids) == chat.usage.prompt_tokens
    plain = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=3, temperature=0)
    assert getattr(plain, "prompt_token_ids", None) is None
    assert getattr(plain.choices[0], "token_ids", None) is None


def test_streams_with_token_ids_and_continuous_usage(client):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            stream_options=options,
                                            extra_body={"ignore_eos": True, "return_token_ids": True}))
    assert all(c.usage is not None for c in chunks)
    assert [c.usage.completion_tokens for c in chunks] == sorted(c.usage.completion_tokens for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].prompt_token_ids and all(
        getattr(c.choices[0], "prompt_token_ids", None) is None for c in with_choices[1:])
    streamed = [t for c in with_choices for t in c.choices[0].token_ids]
    assert streamed == _complete(client, return_token_ids=True).choices[0].token_ids

    chat = list(client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=4, temperature=0,
                                               stream=True, stream_options=options,
                                               extra_body={"ignore_eos": True, "return_token_ids": True}))
    assert all(c.usage is not None for c in chat) and chat[0].usage.completion_tokens == 0
    assert chat[0].prompt_token_ids and chat[-1].usage.completion_tokens == 4
    assert len([t for c in chat for choice in c.choices for t in (getattr(choice, "token_ids", None) or [])]) == 4
    only_final = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
    assert [c.usage is not None for c in only_final] == [False] * (len(only_final) - 1) + [True]


@pytest.mark.parametrize("extra, param, words", [
    ({"logit_bias": {"49152": 1, "7": 2}}, "logit_bias", "out of vocabulary: [49152]"),
    ({"allowed_token_ids": [5, 60000]}, "allowed_token_ids", "out of vocabulary: [60000]"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty"),
    ({"truncate_prompt_tokens": 513}, "truncate_prompt_tokens", "max_model_len=512"),
    ({"bad_words": [" "]}, "bad_words", "at least one token"),
])
def test_bad_values_are_400s_that_name_the_field(client, extra, param, words):
    for call in (lambda: _complete(client, **extra),
                 lambda: client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2,
                                                        extra_body=extra)):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        error = info.value.body
        assert error["param"] == param and words in error["message"], error
