"""A step that raises ends only the request(s) it fails on (finish_reason "error"); the others go on
to the same tokens as a run without the fault, and the engine keeps serving. The fault is injected
into the worker's launch of any step that samples for one chosen request, the way an out-of-range
stop token once broke sampling."""
from collections import Counter

import pytest

from folovllm import SamplingParams
from folovllm.worker.model_runner import ModelRunner
from tests.engine.conftest import make_llm, random_prompts
from tests.engine.test_batching_consistency import assert_same
from tests.tolerance import logprob_gaps

PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
FAULTY = "2"  # the request id the injected fault hits


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(5, seed=7)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, prompts):
    """Each request's completion in a run without the fault."""
    return run_all(make_llm(tiny_llama_dir).llm_engine, prompts)


def run_all(engine, prompts, params=PARAMS) -> dict[str, object]:
    for i, prompt in enumerate(prompts):
        engine.add_request({"prompt_token_ids": prompt}, params, request_id=str(i))
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
    assert engine.kv_cache.num_used_blocks == 0  # nothing leaked, the culprit's blocks included
    return finished


def inject_fault(monkeypatch, when=lambda request_id: request_id == FAULTY) -> None:
    """Launching raises for any batch that samples for a request ``when`` picks, once it has 3
    output tokens (three launches that sampled for it went through: a decode row says no more)."""
    original = ModelRunner.launch
    sampled: Counter[str] = Counter()

    def launch(self, step, *args, **kwargs):
        ids = [r.request_id for r in step.requests if r.sampling is not None]
        ids += step.decodes.request_ids if step.decodes is not None else []
        if any(sampled[rid] >= 3 and when(rid) for rid in ids):
            raise IndexError("injected sampling fault")
        launched = original(self, step, *args, **kwargs)
        sampled.update(ids)
        return launched

    monkeypatch.setattr(ModelRunner, "launch", launch)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_only_the_faulty_request_fails(tiny_llama_dir, prompts, reference, monkeypatch, overlap):
    engine = make_llm(tiny_llama_dir, overlap_scheduling=overlap).llm_engine
    inject_fault(monkeypatch)
    finished = run_all(engine, prompts)
    assert set(finished) == set(reference)
    bad = finished.pop(FAULTY)
    assert bad.finish_reason == "error"
    assert 3 <= len(bad.token_ids) < PARAMS.max_tokens
    assert bad.token_ids == reference[FAULTY].token_ids[:len(bad.token_ids)]
    for request_id, completion in finished.items():
        assert completion.finish_reason == "length"
        assert_same([completion], [reference[request_id]])
    assert engine.stats.finished_by_reason["error"] == 1


def test_a_fault_in_every_request_ends_that_step_only(tiny_llama_dir, prompts, monkeypatch):
    """No single request to blame: the step's requests end, and the engine serves the next ones."""
    engine = make_llm(tiny_llama_dir).llm_engine
    inject_fault(monkeypatch, when=lambda request_id: True)
    finished = run_all(engine, prompts[:3])
    assert {c.finish_reason for c in finished.values()} == {"error"}
    monkeypatch.undo()
    after = run_all(engine, prompts[3:4])
    assert after["0"].finish_reason == "length" and len(after["0"].token_ids) == PARAMS.max_tokens


def test_a_fault_in_output_processing_ends_that_request(tiny_llama_dir, prompts, reference, monkeypatch):
    engine = make_llm(tiny_llama_dir).llm_engine
    original = engine.output_processor.append_token

    def append_token(request, token_id, logprobs=None):
        if request.parent_id == FAULTY and request.num_output_tokens >= 5:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "injected")
        return original(request, token_id, logprobs)

    monkeypatch.setattr(engine.output_processor, "append_token", append_token)
    finished = run_all(engine, prompts)
    assert finished.pop(FAULTY).finish_reason == "error"
    for request_id, completion in finished.items():
        assert_same([completion], [reference[request_id]])


def test_a_fault_in_a_plain_rows_text_ends_that_request(tiny_llama_dir, prompts, monkeypatch):
    """Tokens taken in bulk (no logprobs) keep the isolation: a detokenizer that raises ends its request alone."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    reference = run_all(make_llm(tiny_llama_dir).llm_engine, prompts, params)
    engine = make_llm(tiny_llama_dir).llm_engine
    engine.add_request({"prompt_token_ids": prompts[0]}, params, request_id="bad")
    bad = engine.groups["bad"].samples[0]
    original = bad.detokenizer.append

    def append(token_id):
        if len(bad.output_token_ids) >= 5:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "injected")
        return original(token_id)

    bad.detokenizer.append = append
    finished = run_all(engine, prompts, params)
    assert finished.pop("bad").finish_reason == "error"
    for request_id, completion in finished.items():
        assert completion.finish_reason == "length" and completion.token_ids == reference[request_id].token_ids


def test_llm_generate_returns_the_failed_request(tiny_llama_dir, prompts, reference, monkeypatch):
    llm = make_llm(tiny_llama_dir)
    inject_fault(monkeypatch, when=lambda request_id: request_id == "1")  # the second prompt
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], PARAMS, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "length"]
    assert logprob_gaps(outs[0].outputs[0])  # logprobs of the survivors are intact
