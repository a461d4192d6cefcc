"""The worker runs plain step inputs on its own (no engine, no Request) and keeps each seeded
request's RNG until the engine says the request finished."""
from __future__ import annotations

import pytest

from folovllm import SamplingParams
from folovllm.config import EngineConfig
from folovllm.sample.rows import SamplingRow
from folovllm.worker.step_input import ScheduledRequest, StepInput
from folovllm.worker.worker import Worker
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

BLOCK_SIZE = 4


def make_worker(model_dir: str) -> Worker:
    config = EngineConfig(model=model_dir, dtype="float32", block_size=BLOCK_SIZE, num_gpu_blocks_override=32)
    return Worker(config.resolve(), model_dir)  # the engine resolves its config before building a worker


def test_worker_decodes_plain_inputs_like_the_engine(tiny_llama_dir) -> None:  # noqa: F811
    prompt = random_prompts(1, seed=4)[0]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    expected = make_llm(tiny_llama_dir).generate([{"prompt_token_ids": prompt}], params,
                                                 use_tqdm=False)[0].outputs[0].token_ids

    worker = make_worker(tiny_llama_dir)
    with pytest.raises(RuntimeError, match="initialize_cache"):
        worker.launch(StepInput([]))
    assert worker.determine_num_kv_blocks(128) == 32
    worker.initialize_cache(32, 128)
    table = list(range(32))
    tokens: list[int] = []
    new, start = list(prompt), 0
    while len(tokens) < 5:
        row = SamplingRow(params, num_output_tokens=len(tokens))
        out = worker.execute(StepInput([ScheduledRequest("r", new, 0, start, table, row)]))
        assert out.request_ids == ["r"] and out.wait_s >= 0.0
        tokens += out.sampled_token_ids
        start += len(new)
        new = out.sampled_token_ids
    assert tokens == expected


def test_reused_request_id_restarts_its_rng(tiny_llama_dir) -> None:  # noqa: F811
    """The finished request's RNG is dropped before a new request with the same id samples."""
    engine = make_llm(tiny_llama_dir, overlap_scheduling=True).llm_engine
    prompt = random_prompts(1, seed=6)[0]
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=8, ignore_eos=True, output_kind="final_only")
    runs = []
    for _ in range(2):
        engine.add_request({"prompt_token_ids": prompt}, params, request_id="same")
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        runs.append(outputs[-1].outputs[0].token_ids)
    assert runs[0] == runs[1]
    engine.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1), request_id="next")
    engine.step()
    assert "same" not in engine.worker.runner.states.generators
