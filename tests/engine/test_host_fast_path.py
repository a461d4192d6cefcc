"""The host's fast paths change no output: decode rows from what the worker keeps (FOLOVLLM_DECODE_ROWS), running
decodes scheduled in one pass (FOLOVLLM_BULK_DECODES) and a step's plain tokens taken in bulk
(FOLOVLLM_BATCHED_OUTPUTS), each on and off, over a batch that mixes
every per-request setting, with overlap, preemption and chunked prefill."""
from __future__ import annotations

import pytest

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

SWITCHES = ("FOLOVLLM_DECODE_ROWS", "FOLOVLLM_BULK_DECODES", "FOLOVLLM_BATCHED_OUTPUTS")


def mixed_params(stop_token: int) -> list[SamplingParams]:
    """One request per setting the fast paths must keep."""
    return [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=3, max_tokens=18, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=5, n=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, min_tokens=6, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.0, max_tokens=10, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=9, presence_penalty=0.5, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=14, detokenize=False, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=14, stop=[" the", "e"], ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=9, seed=11, logit_bias={7: 2.0}, ignore_eos=True),
    ]


def outputs(model_dir: str, monkeypatch, on: bool, prompts: list[list[int]], params: list[SamplingParams],
            **engine_args) -> list[tuple]:
    for name in SWITCHES:
        monkeypatch.setenv(name, "on" if on else "off")
    llm = make_llm(model_dir, **engine_args)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.request_id, c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob,
             c.logprobs) for o in outs for c in o.outputs]


@pytest.fixture(scope="module")
def stop_token(tiny_llama_dir) -> int:  # noqa: F811
    """A token the greedy run of the first prompt produces a few tokens in: a stop token that fires."""
    llm = make_llm(tiny_llama_dir)
    tokens = llm.generate([{"prompt_token_ids": random_prompts(1, seed=3)[0]}],
                          SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].token_ids
    return tokens[4]


@pytest.mark.parametrize("engine_args", [
    {},
    dict(overlap_scheduling=True),
    dict(num_gpu_blocks_override=40, max_model_len=128),  # preemption
    dict(max_num_batched_tokens=5),  # prompts in chunks beside decodes
], ids=["plain", "overlap", "preemption", "chunked"])
def test_outputs_equal_with_the_fast_paths_off(tiny_llama_dir, monkeypatch, stop_token, engine_args):  # noqa: F811
    params = mixed_params(stop_token)
    prompts = random_prompts(len(params), seed=3)
    prompts[1] = prompts[4] = prompts[0]  # their greedy run meets the stop token
    fast = outputs(tiny_llama_dir, monkeypatch, True, prompts, params, **engine_args)
    slow = outputs(tiny_llama_dir, monkeypatch, False, prompts, params, **engine_args)
    assert fast == slow
    reasons = {(r[0], r[4]) for r in fast}
    assert ("1", "stop") in reasons and ("4", "stop") in reasons and ("0", "length") in reasons


def test_the_fast_paths_run(tiny_llama_dir, monkeypatch) -> None:  # noqa: F811
    """With the switches on, decode steps come as decode rows and plain tokens skip the one-by-one path."""
    for name in SWITCHES:
        monkeypatch.setenv(name, "on")
    engine = make_llm(tiny_llama_dir).llm_engine
    steps = []
    launch = engine.worker.launch
    engine.worker.launch = lambda step: steps.append(step) or launch(step)
    plans = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    took = []
    take_token = engine.results._take_token
    engine.results._take_token = lambda *args: took.append(args) or take_token(*args)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(3, seed=5)):
        engine.add_request({"prompt_token_ids": prompt}, params, request_id=str(i))
    while engine.has_unfinished_requests():
        engine.step()
    assert steps[0].decodes is None and all(r.keep for r in steps[0].requests)
    assert all(s.decodes is not None and not s.requests for s in steps[1:])
    assert sum(len(s.decodes) for s in steps[1:]) == 3 * 7  # every token after the first
    assert not took and engine.stats.generation_tokens == 24
    assert [p.num_bulk_decodes for p in plans if p.requests] == [0] + [3] * 7  # every decode scheduled in one pass
    engine.add_request({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=1), request_id="next")
    engine.step()  # the next launch carries the ended requests: both sides forget them
    assert engine.inputs.kept == {"next"} and set(engine.worker.runner.states.row_of) == {"next"}
