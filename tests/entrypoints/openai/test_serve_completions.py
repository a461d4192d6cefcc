"""/v1/completions and /v1/chat/completions through the official openai client."""
from __future__ import annotations

PROMPT = "The capital of France is"


def _stream_text(stream) -> tuple[str, str | None, list]:
    text, finish, chunks = "", None, []
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish, chunks


def test_completion_matches_offline_greedy(client, smol_llm):
    from folovllm import SamplingParams

    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0)
    offline = smol_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    choice = response.choices[0]
    assert choice.text == offline.outputs[0].text
    assert choice.finish_reason == "length"
    assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert response.usage.completion_tokens == 8
    assert response.usage.total_tokens == response.usage.prompt_tokens + 8


def test_streaming_equals_non_streaming(client):
    full = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0)
    stream = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    text, finish, chunks = _stream_text(stream)
    assert text == full.choices[0].text and finish == "length"
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []


def test_prompt_forms_n_and_usage(client, http):
    hello = http.post("/tokenize", json={"prompt": "Hello"}).json()["tokens"]
    for prompt in (["Hello", "Hello"], [hello, hello]):
        response = client.completions.create(model="smol", prompt=prompt, max_tokens=3, temperature=0.8,
                                             n=3, seed=1, extra_body={"ignore_eos": True})
        assert [c.index for c in response.choices] == list(range(6))
        assert response.usage.prompt_tokens == 2 * len(hello)
        assert response.usage.completion_tokens == 6 * 3
        # the same seed for both prompts: choice j of each prompt is the same sample
        assert [c.text for c in response.choices[:3]] == [c.text for c in response.choices[3:]]
    single = client.completions.create(model="smol", prompt=hello, max_tokens=2, temperature=0)
    assert single.usage.prompt_tokens == len(hello)


def test_echo(client):
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert response.choices[0].text.startswith(PROMPT)


def test_stop_string_never_leaks_when_streaming(client):
    free = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    stop = free[len(free) // 2: len(free) // 2 + 4]  # a stop string in the middle of the greedy text
    expected = free[: free.index(stop)]
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    assert response.choices[0].text == expected and response.choices[0].finish_reason == "stop"
    text, finish, chunks = _stream_text(client.completions.create(
        model="smol", prompt=PROMPT, max_tokens=8, temperature=0, stop=stop, stream=True))
    assert text == expected and finish == "stop"
    assert all(stop[:2] not in c.choices[0].text for c in chunks if c.choices)


def test_seed_reproducible(client):
    def sample(seed):
        return [c.text for c in client.completions.create(
            model="smol", prompt="Once upon a time", max_tokens=8, temperature=1.0, n=2, seed=seed).choices]

    first = sample(7)
    assert sample(7) == first
    assert first[0] != first[1]  # the n samples use different seeds


def test_completion_logprobs(client):
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = response.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == response.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and len(top) >= 3
        assert max(top.values()) == logprob  # greedy: the sampled token is the most likely


def test_chat(client, smol_llm):
    from folovllm import SamplingParams

    messages = [{"role": "user", "content": "Say hi"}]
    response = client.chat.completions.create(model="smol", messages=messages, max_completion_tokens=6,
                                              temperature=0)
    offline = smol_llm.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == offline.outputs[0].text
    assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert response.usage.completion_tokens == len(offline.outputs[0].token_ids)


def test_chat_streaming_role_first_and_usage(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]
    full = client.chat.completions.create(model="smol", messages=messages, max_tokens=6, temperature=0, n=2)
    chunks = list(client.chat.completions.create(model="smol", messages=messages, max_tokens=6, temperature=0,
                                                 n=2, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in full.choices]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_logprobs(client):
    response = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == 3
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].token == item.token and item.logprob <= 0


def test_models_tokenize_detokenize(client, http):
    assert [m.id for m in client.models.list().data] == ["smol"]
    tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == PROMPT
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 2
    assert http.get("/health").status_code == 200


def test_priority_and_user_are_accepted(client):
    completion = client.completions.create(model="smol", prompt=PROMPT, max_tokens=4, temperature=0,
                                           user="tenant-a", extra_body={"priority": -3})
    chat = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0, user="tenant-b",
                                          extra_body={"priority": 2})
    assert completion.usage.completion_tokens == 4 and chat.usage.completion_tokens <= 4
