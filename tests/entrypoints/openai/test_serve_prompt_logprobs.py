"""Prompt logprobs through the server, read with the official openai client: echo + logprobs in the
completions logprobs format (scoring with max_tokens=0, as lm-eval sends it), and vLLM's
``prompt_logprobs`` field on completions and chat."""
import pytest

from folovllm import SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog."
ATOL = 1e-4


@pytest.fixture(scope="module")
def offline(smol_llm):
    """The offline engine's prompt logprobs of PROMPT (same weights and dtype as the server)."""
    return smol_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2),
                             use_tqdm=False)[0]


def test_echo_with_logprobs_lists_prompt_then_generated_tokens(client, offline):
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0,
                                         echo=True, logprobs=2)
    choice = response.choices[0]
    lp = choice.logprobs
    num_prompt = len(offline.prompt_token_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == num_prompt + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for pos in range(1, num_prompt):
        entry = offline.prompt_logprobs[pos][offline.prompt_token_ids[pos]]
        assert lp.token_logprobs[pos] == pytest.approx(entry.logprob, abs=ATOL)
        assert len(lp.top_logprobs[pos]) >= 2 and max(lp.top_logprobs[pos].values()) >= lp.token_logprobs[pos]
    assert "".join(lp.tokens[:num_prompt]) == PROMPT
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert lp.text_offset[num_prompt] == len(PROMPT)  # generated tokens follow the echoed prompt
    plain = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    assert choice.text == PROMPT + plain.choices[0].text
    assert lp.token_logprobs[num_prompt:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=ATOL)


@pytest.mark.parametrize("logprobs", [0, 1])
def test_scoring_request_generates_nothing(client, offline, logprobs):
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=0, temperature=0,
                                         echo=True, logprobs=logprobs)
    choice = response.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(offline.prompt_token_ids)
    assert choice.logprobs.token_logprobs[0] is None
    total = sum(choice.logprobs.token_logprobs[1:])
    expected = sum(offline.prompt_logprobs[p][t].logprob for p, t in enumerate(offline.prompt_token_ids) if p)
    assert total == pytest.approx(expected, abs=1e-3)
    assert response.usage.completion_tokens == 0
    assert response.usage.prompt_tokens == len(offline.prompt_token_ids)


def test_streamed_echo_carries_prompt_logprobs_first(client, offline):
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, temperature=0,
                                            echo=True, logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs[0] is None
    assert len(first.logprobs.tokens) == len(offline.prompt_token_ids)
    streamed = [t for c in chunks[1:] for ch in c.choices if ch.logprobs for t in ch.logprobs.tokens]
    assert len(streamed) == 2


def test_prompt_logprobs_field(client, offline):
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, temperature=0,
                                         extra_body={"prompt_logprobs": 2})
    entries = response.choices[0].prompt_logprobs
    assert len(entries) == len(offline.prompt_token_ids) and entries[0] is None
    for pos, (token, entry) in enumerate(zip(offline.prompt_token_ids[1:], entries[1:]), start=1):
        ours = entry[str(token)]
        ref = offline.prompt_logprobs[pos][token]
        assert ours["logprob"] == pytest.approx(ref.logprob, abs=ATOL) and ours["rank"] == ref.rank
        assert sorted(e["rank"] for e in entry.values())[:2] == [1, 2]
    assert response.choices[0].logprobs is None  # prompt_logprobs alone leaves `logprobs` off

    chat = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 0})
    entries = chat.prompt_logprobs
    assert entries[0] is None and len(entries) == chat.usage.prompt_tokens
    assert all(len(e) == 1 or sorted(v["rank"] for v in e.values())[0] == 1 for e in entries[1:])


def test_prompt_logprobs_cannot_stream(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": 1})
