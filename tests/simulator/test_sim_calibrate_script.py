"""scripts/sim_calibrate.py's API server figures read from a step trace, as the simulator applies them."""
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
