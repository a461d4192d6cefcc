"""scripts/sim_calibrate.py's API server figures read from a step trace, as the simulator applies them;
scripts/sim_fidelity.py's machine-speed factors from the probes around a workload."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script():
    sys.path.insert(0, str(SCRIPTS))  # it imports sim_fidelity beside it
    try:
        spec = importlib.util.spec_from_file_location("sim_calibrate", SCRIPTS / "sim_calibrate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def step(start, duration, prefill):
    return json.dumps({"time": start + duration, "duration_s": duration, "num_prefill_tokens": prefill,
                       "num_scheduled": 1}) + "\n"


def test_the_burst_term_is_per_request_after_the_first(tmp_path):
    script = load_script()
    size, prompt = script.BURST_SIZE, script.BURST_PROMPT_LEN
    lone, per_request = 0.002, 0.0005
    trace = tmp_path / "steps.jsonl"
    # each burst sent at t is taken in two steps, the second starting lone + (size - 1) x per_request after t
    sends = [10.0, 20.0, 30.0]
    trace.write_text("".join(step(t + lone, 0.001, prompt) + step(t + lone + (size - 1) * per_request, 0.05,
                                                                (size - 1) * prompt) for t in sends))
    assert script.api_server_burst_s(trace, sends, lone) == pytest.approx(per_request)
    assert script.api_server_s(trace, sends) == pytest.approx(lone)


def load_fidelity():
    spec = importlib.util.spec_from_file_location("sim_fidelity", SCRIPTS / "sim_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe_steps(start, decode_s, prefill_s, prompt):
    """A probe's traced steps from ``start``: per request a prefill step, then one-row decode steps."""
    lines, now = [], start
    for _ in range(3):
        for prefill, duration in [(prompt, prefill_s), *[(0, decode_s)] * 5]:
            now += duration
            lines.append(json.dumps({"time": now, "duration_s": duration, "num_prefill_tokens": prefill,
                                     "num_decode_tokens": 0 if prefill else 1, "num_scheduled": 1}) + "\n")
    return lines, now


def test_a_workload_is_compared_at_the_speed_of_the_probes_around_it(tmp_path):
    fidelity = load_fidelity()
    from folovllm.simulator.speed import PROBE_PROMPT_LEN

    calibration = {"decode_step_s": 0.007, "prefill_step_s": 0.2}
    # probe 0 before workload 0, probe 1 between workloads 0 and 1, probe 2 after workload 1
    first, end0 = probe_steps(0.0, 0.006, 0.2, PROBE_PROMPT_LEN)
    second, end1 = probe_steps(10.0, 0.005, 0.3, PROBE_PROMPT_LEN)
    third, end2 = probe_steps(20.0, 0.007, 0.3, PROBE_PROMPT_LEN)
    (tmp_path / "steps-0.jsonl").write_text("".join(first + second + third))
    (tmp_path / "windows-0.json").write_text(json.dumps(
        {"probe-0": [0.0, end0], "probe-1": [10.0, end1], "probe-2": [20.0, end2], "a": [end0, 10.0]}))
    (factors,) = fidelity.workload_speed(tmp_path, 0, calibration)
    assert factors == {"decode": pytest.approx(0.0055 / 0.007), "prefill": pytest.approx(0.25 / 0.2)}
    (factors,) = fidelity.workload_speed(tmp_path, 1, calibration)
    assert factors == {"decode": pytest.approx(0.006 / 0.007), "prefill": pytest.approx(0.3 / 0.2)}
    assert fidelity.workload_speed(tmp_path, 2, calibration) == []  # no probe after it
    assert fidelity.workload_speed(tmp_path, 0, {}) == []  # a profile without a probe
