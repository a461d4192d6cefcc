"""logit_bias, allowed_token_ids, bad_words and truncate_prompt_tokens through the offline API."""
import pytest

from folovllm import SamplingParams

PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]


def _greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **fields)


@pytest.fixture(scope="module")
def plain(smol_llm):
    """The greedy outputs of PROMPTS with none of the fields set."""
    return [o.outputs[0] for o in smol_llm.generate(PROMPTS, _greedy(), use_tqdm=False)]


def test_neutral_settings_leave_greedy_outputs_unchanged(smol_llm, plain):
    vocab = smol_llm.llm_engine.vocab_size
    neutral = _greedy(logit_bias={plain[0].token_ids[0]: 0.0}, allowed_token_ids=list(range(vocab)),
                      bad_words=["zebra-unicorn-xylophone"], truncate_prompt_tokens=-1)
    outs = smol_llm.generate(PROMPTS, neutral, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [p.token_ids for p in plain]


def test_allowed_token_ids_bound_every_sample(smol_llm, plain):
    allowed = plain[0].token_ids[:3] + [11, 12]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, allowed_token_ids=allowed)
    out = smol_llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 8 and set(out.token_ids) <= set(allowed)


def test_logit_bias_bans_and_forces_tokens_and_bad_words_are_never_completed(smol_llm, plain):
    assert "Paris" in plain[0].text
    params = [_greedy(logit_bias={plain[0].token_ids[0]: -100}), _greedy(logit_bias={42: 100}),
              _greedy(bad_words=["Paris"])]
    banned, forced, no_paris = (o.outputs[0] for o in smol_llm.generate([PROMPTS[0]] * 3, params, use_tqdm=False))
    assert banned.token_ids[0] != plain[0].token_ids[0]
    assert forced.token_ids == [42] * 6
    assert "Paris" not in no_paris.text


def test_truncate_prompt_tokens_keeps_the_last_tokens(smol_llm):
    full = smol_llm.tokenizer.encode(PROMPTS[0])
    out, same = smol_llm.generate([PROMPTS[0], {"prompt_token_ids": full[-3:]}],
                                  [_greedy(truncate_prompt_tokens=3), _greedy()], use_tqdm=False)
    assert out.prompt_token_ids == full[-3:] and out.prompt == PROMPTS[0]
    assert out.outputs[0].token_ids == same.outputs[0].token_ids
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be at most max_model_len=512"):
        smol_llm.generate(PROMPTS[0], SamplingParams(truncate_prompt_tokens=513), use_tqdm=False)


@pytest.mark.parametrize("fields, named", [
    (dict(logit_bias={10**6: 1.0}), r"logit_bias must be in \[0, 49152\).*\[1000000\]"),
    (dict(allowed_token_ids=[1, 60000, 70000]), r"allowed_token_ids must be in .*\[60000, 70000\]"),
])
def test_out_of_vocabulary_ids_are_named(smol_llm, fields, named):
    with pytest.raises(ValueError, match=named):
        smol_llm.generate(PROMPTS[0], SamplingParams(**fields), use_tqdm=False)
    assert not smol_llm.llm_engine.has_unfinished_requests()
