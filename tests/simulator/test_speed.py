"""The machine-speed probe: its figures from traced steps, and the profile scaled by the factors."""
import pytest

from folovllm.simulator.calibrate import calibrate
from folovllm.simulator.cost_model import (
    LINEAR_TERMS,
    LinearCostModel,
    StepShape,
    load_linear_profile,
)
from folovllm.simulator.speed import (
    DECODE_TERMS,
    PROBE_PROMPT_LEN,
    combine,
    probe_of,
    scaled,
    speed_factors,
)
from tests.simulator.test_calibrate import synthetic_trace

COEFFICIENTS = {t: 1e-4 * (i + 1) for i, t in enumerate(LINEAR_TERMS)}


def traced(prefill, decode, duration, scheduled=1):
    return {"num_prefill_tokens": prefill, "num_decode_tokens": decode, "num_scheduled": scheduled,
            "duration_s": duration}


def test_the_probe_reads_lone_decode_and_prefill_steps_only():
    steps = [traced(PROBE_PROMPT_LEN, 0, 0.2), traced(0, 1, 0.006), traced(0, 1, 0.007), traced(0, 1, 0.009),
             traced(PROBE_PROMPT_LEN, 0, 0.1), traced(0, 2, 0.5, scheduled=2), traced(100, 0, 0.9)]
    assert probe_of(steps) == {"decode_step_s": pytest.approx(0.007), "prefill_step_s": pytest.approx(0.15)}
    with pytest.raises(ValueError, match="needs both"):
        probe_of([traced(0, 1, 0.006)])


def test_factors_scale_decode_and_prefill_terms_apart():
    model = LinearCostModel("m", COEFFICIENTS, prefill_knee_tokens=256)
    factors = speed_factors(combine([{"decode_step_s": 0.006, "prefill_step_s": 0.1},
                                     {"decode_step_s": 0.008, "prefill_step_s": 0.1}]),
                            {"decode_step_s": 0.0056, "prefill_step_s": 0.125})
    assert factors == {"decode": pytest.approx(1.25), "prefill": pytest.approx(0.8)}
    fast = scaled(model, factors)
    for term in LINEAR_TERMS:
        factor = factors["decode"] if term in DECODE_TERMS else factors["prefill"]
        assert fast.coefficients[term] == pytest.approx(model.coefficients[term] * factor)
    decode_only = StepShape(0, 3, 900, 3)
    assert fast.step_time(decode_only) == pytest.approx(model.step_time(decode_only) * 1.25)
    assert fast.fit["machine_speed"] == factors and "machine_speed" not in model.fit
    same = scaled(model, {"decode": 1.0, "prefill": 1.0})
    shape = StepShape(300, 2, 1500, 3, prefill_cached_pairs=1000, prefill_new_pairs=45150)
    assert same.step_time(shape) == pytest.approx(model.step_time(shape))


def test_a_profile_keeps_its_probe(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    probe = {"decode_step_s": 0.007, "prefill_step_s": 0.12}
    calibrate(tmp_path / "t.jsonl", tmp_path / "p.json", "probed", speed_probe=probe)
    assert load_linear_profile(tmp_path / "p.json").speed_probe == probe
    calibrate(tmp_path / "t.jsonl", tmp_path / "q.json", "unprobed")
    assert load_linear_profile(tmp_path / "q.json").speed_probe == {}
