"""Timed-arrival driver: arrival generator statistics and per-request records on a tiny model."""
import numpy as np

from folovllm import SamplingParams
from folovllm.bench.driver import TimedRequest, drive, poisson_arrivals, summarize
from tests.engine.conftest import make_llm, tiny_llama_dir  # noqa: F401  (fixture)


def test_poisson_arrivals_rate_and_reproducibility():
    arrivals = poisson_arrivals(4000, 8.0, seed=3)
    assert arrivals[0] == 0 and all(b >= a for a, b in zip(arrivals, arrivals[1:]))
    assert np.mean(np.diff(arrivals)) == __import__("pytest").approx(1 / 8.0, rel=0.05)
    assert arrivals == poisson_arrivals(4000, 8.0, seed=3)
    assert poisson_arrivals(3, float("inf"), seed=0) == [0.0, 0.0, 0.0]


def test_drive_records_every_request_in_arrival_order(tiny_llama_dir):  # noqa: F811
    llm = make_llm(tiny_llama_dir)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    reqs = [TimedRequest([5, 6, 7], params, 0.0, tag="a"), TimedRequest([8, 9], params, 0.2, tag="b", user="u")]
    records, trace = drive(llm.llm_engine, reqs)
    assert [r.tag for r in records] == ["a", "b"]
    assert records[1].arrival - records[0].arrival >= 0.2 - 1e-3
    for r in records:
        assert r.num_output_tokens == 4 and 0 <= r.queue_delay <= r.ttft <= r.e2el
    assert trace.steps >= 4 and trace.peak_running >= 1 and trace.preemptions == 0
    summary = summarize(records)
    assert summary["num_requests"] == 2 and summary["output_tokens"] == 8
