"""The offline API on the real default model: vLLM-compatible behaviour and bad input."""
import pytest

from folovllm import LLM, SamplingParams

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


def test_results_in_input_order_with_metrics(smol_llm):
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (12, 3, 7)]
    outs = smol_llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    for out, n in zip(outs, (12, 3, 7)):
        completion = out.outputs[0]
        assert out.prompt_token_ids == smol_llm.tokenizer.encode(out.prompt)
        assert len(completion.token_ids) <= n
        assert completion.finish_reason in ("stop", "length")
        m = out.metrics
        assert m.arrival_time <= m.first_token_time <= m.finished_time


def test_greedy_continuation_is_sensible(smol_llm):
    out = smol_llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8),
                            use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text


def test_chat_uses_template_and_stops_at_eos(smol_llm):
    out = smol_llm.chat([{"role": "user", "content": "Say hello."}],
                        SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0]
    assert "<|im_start|>user\nSay hello.<|im_end|>" in smol_llm.tokenizer.decode(out.prompt_token_ids)
    assert out.outputs[0].text.strip()
    assert out.outputs[0].finish_reason == "stop"  # the instruct model ends its turn with EOS


def test_seed_reproducible_regardless_of_batch(smol_llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    noisy = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    alone = smol_llm.generate(PROMPTS[0], seeded, use_tqdm=False)[0].outputs[0].token_ids
    mixed = smol_llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [noisy, seeded, noisy],
                              use_tqdm=False)[1].outputs[0].token_ids
    assert alone == mixed


def test_n_samples_and_logprobs(smol_llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, logprobs=3, ignore_eos=True)
    out = smol_llm.generate(PROMPTS[2], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # distinct samples
    for completion in out.outputs:
        assert len(completion.logprobs) == len(completion.token_ids) == 6
        for token, step in zip(completion.token_ids, completion.logprobs):
            assert token in step and 3 <= len(step) <= 4
            assert all(lp.logprob <= 0 for lp in step.values())
        total = sum(step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs))
        assert completion.cumulative_logprob == pytest.approx(total, abs=1e-4)


def test_stop_string_is_cut_from_text(smol_llm):
    free = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16),
                             use_tqdm=False)[0].outputs[0]
    assert " 7" in free.text
    out = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16, stop=[" 7"]),
                            use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == " 7"
    assert out.text == free.text[:free.text.index(" 7")]


def test_stop_token_ids_and_min_tokens(smol_llm):
    free = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=8),
                             use_tqdm=False)[0].outputs[0]
    stop_id = free.token_ids[2]
    out = smol_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=8,
                                                          stop_token_ids=[stop_id]), use_tqdm=False)[0]
    completion = out.outputs[0]
    assert completion.token_ids[-1] == stop_id and completion.stop_reason == stop_id
    assert len(completion.token_ids) <= 3
    forced = smol_llm.generate("1, 2, 3, 4,", SamplingParams(
        temperature=0, max_tokens=8, min_tokens=8, stop_token_ids=[stop_id]), use_tqdm=False)[0]
    assert len(forced.outputs[0].token_ids) == 8 and stop_id not in forced.outputs[0].token_ids


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
])
def test_bad_sampling_params_raise(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**kwargs)


def test_bad_prompts_raise_and_engine_keeps_serving(smol_llm):
    with pytest.raises(ValueError, match="empty"):
        smol_llm.generate("", SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match=r"600 tokens.*max_model_len is 512"):
        smol_llm.generate({"prompt_token_ids": [100] * 600}, SamplingParams(max_tokens=4),
                          use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):  # one bad prompt: none of the batch is queued
        smol_llm.generate(["fine", ""], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not smol_llm.llm_engine.has_unfinished_requests()
    out = smol_llm.generate("Still alive?", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4 or out[0].outputs[0].finish_reason == "stop"


def test_unknown_model_path_and_architecture(tmp_path):
    with pytest.raises(ValueError, match="does-not-exist"):
        LLM(str(tmp_path / "does-not-exist"))
    (tmp_path / "config.json").write_text('{"architectures": ["MadeUpForCausalLM"], "hidden_size": 8}')
    with pytest.raises(ValueError, match="MadeUpForCausalLM"):
        LLM(str(tmp_path), load_format="dummy")


def test_abort_frees_blocks(smol_llm):
    engine = smol_llm.llm_engine
    engine.add_request("Tell me a long story.", SamplingParams(max_tokens=100), request_id="victim")
    engine.add_request("Hi", SamplingParams(temperature=0, max_tokens=3), request_id="other")
    engine.step()
    assert engine.kv_cache.num_used_blocks > 0
    engine.abort_request("victim")
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["other"]
    assert engine.kv_cache.num_used_blocks == 0


def test_the_engine_rejects_stop_ids_outside_the_vocabulary(smol_llm) -> None:
    engine = smol_llm.llm_engine
    vocab = engine.model.arch.vocab_size
    with pytest.raises(ValueError, match="stop_token_ids must be in"):
        engine.add_request("Hi", SamplingParams(stop_token_ids=[vocab], min_tokens=1))
    assert not engine.has_unfinished_requests()


def test_chat_output_carries_the_rendered_prompt_and_logprobs_decoded_text(smol_llm):
    out = smol_llm.chat([{"role": "user", "content": "Say hello."}],
                        SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.prompt.startswith("<|im_start|>") and "Say hello.<|im_end|>" in out.prompt
    assert smol_llm.tokenizer.encode(out.prompt, add_special_tokens=False) == out.prompt_token_ids
    paris = smol_llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=1, logprobs=1),
                              use_tqdm=False)[0].outputs[0]
    token_id = paris.token_ids[0]
    assert paris.logprobs[0][token_id].decoded_token == " Paris"  # text, not the vocabulary's "ĠParis"


def test_chat_passes_tools_and_template_kwargs_and_continues_the_last_message(smol_llm):
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if tools %}tools: {{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
                "{% if shout %}SHOUT\n{% endif %}{% if add_generation_prompt %}assistant:{% endif %}")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    params = SamplingParams(temperature=0, max_tokens=1)
    out = smol_llm.chat([{"role": "user", "content": "Hi"}], params, use_tqdm=False, chat_template=template,
                        tools=[tool], chat_template_kwargs={"shout": True})[0]
    assert out.prompt == "user: Hi\ntools: get_weather\nSHOUT\nassistant:"
    partial = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello the"}]
    out = smol_llm.chat(partial, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0]
    assert out.prompt.endswith("Hello the")  # no end-of-turn: the reply goes on from there
    with pytest.raises(ValueError, match="continue_final_message"):
        smol_llm.chat(partial, params, use_tqdm=False, continue_final_message=True)
