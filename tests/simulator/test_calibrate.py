"""The least-squares fit recovers known coefficients and reads engine traces (old ones get a clear error)."""
import json

import numpy as np
import pytest

from folovllm.simulator.calibrate import (
    calibrate,
    fit_linear,
    price_steps,
    read_trace_shapes,
)
from folovllm.simulator.cost_model import (
    LINEAR_TERMS,
    OPTIONAL_TERMS,
    LinearCostModel,
    StepShape,
    load_linear_profile,
)

TRUE = {"fixed_s": 0.004, "per_prefill_token_s": 2e-5, "per_decode_row_s": 3e-4, "per_context_token_s": 1e-7,
        "per_request_s": 5e-5, "per_prefill_step_s": 2e-3, "per_prefill_token_context_s": 3e-10,
        "per_prefill_cached_pair_s": 2e-8, "per_prefill_new_pair_s": 4e-9, "per_prefill_token_below_knee_s": 1.5e-5}
KNEE = 512


def synthetic_trace(path, num_steps=400, noise=0.0, seed=0, gap=None):
    rng = np.random.default_rng(seed)
    now = 0.0
    with open(path, "w") as f:
        for _ in range(num_steps):
            prefill = int(rng.integers(1, 2048)) if rng.random() < 0.5 else 0  # decode-only steps too
            decode = int(rng.integers(0, 200))
            requests = decode + int(rng.integers(0, 8)) + (1 if prefill else 0)
            context = int(rng.integers(0, 100_000))
            cached = prefill * int(rng.integers(0, 1500)) if rng.random() < 0.5 else 0  # prefix-cache hits
            chunks = np.diff([0, *sorted(rng.integers(0, prefill + 1, size=int(rng.integers(0, 4)))), prefill])
            new_pairs = int(sum(n * (n + 1) // 2 for n in chunks))  # the prefill split into 1-4 prompts
            shape = StepShape(prefill, decode, context, requests, prefill_cached_pairs=cached,
                              prefill_new_pairs=new_pairs)
            duration = float(np.dot(shape.features(KNEE), [TRUE[t] for t in LINEAR_TERMS]))
            duration *= 1 + noise * rng.standard_normal()
            now = now + gap + duration if gap is not None else 0.0
            f.write(json.dumps({"time": now, "num_prefill_tokens": prefill, "num_decode_tokens": decode,
                                "num_running": requests, "num_waiting": 0, "num_preempted": 0,
                                "kv_blocks_used": 0, "kv_usage": 0.0, "num_scheduled": requests,
                                "context_tokens": context, "prefill_cached_pairs": cached,
                                "prefill_new_pairs": new_pairs,
                                "duration_s": duration}) + "\n")


def test_fit_recovers_known_coefficients(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    model = calibrate(tmp_path / "t.jsonl", tmp_path / "p.json", "synthetic", {"num_kv_blocks": 100})
    assert model.prefill_knee_tokens == KNEE  # the knee the fit picked among its candidates
    for term, value in TRUE.items():
        assert model.coefficients[term] == pytest.approx(value, rel=1e-6)
    assert model.fit["r2"] == pytest.approx(1.0) and model.fit["median_rel_error"] < 1e-6
    loaded = load_linear_profile(tmp_path / "p.json")
    assert loaded.coefficients == model.coefficients and loaded.defaults == {"num_kv_blocks": 100}


def test_the_engine_loop_between_busy_steps_is_added_to_every_step(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl", gap=0.002)
    model = calibrate(tmp_path / "t.jsonl", tmp_path / "p.json", "with-gaps")
    assert model.fit["between_steps_s"] == pytest.approx(0.002)
    assert model.coefficients["fixed_s"] == pytest.approx(TRUE["fixed_s"] + 0.002)
    assert load_linear_profile(tmp_path / "p.json").coefficients["fixed_s"] == pytest.approx(0.006)


def test_a_trace_without_cached_pairs_leaves_that_term_unfitted(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    for record in lines:
        record.pop("prefill_cached_pairs")
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    shapes, _ = read_trace_shapes(tmp_path / "old.jsonl")
    assert all(s.prefill_cached_pairs == 0 for s in shapes)
    model = calibrate(tmp_path / "old.jsonl", tmp_path / "p.json", "old")
    assert model.coefficients["per_prefill_cached_pair_s"] == 0.0
    assert "per_prefill_cached_pair_s" in model.fit["unfitted_terms"]


def test_cached_pairs_cost_only_in_prefill_steps():
    model = LinearCostModel("x", {**dict.fromkeys(LINEAR_TERMS, 0.0), "fixed_s": 0.01,
                                  "per_prefill_cached_pair_s": 1e-6})
    assert model.step_time(StepShape(56, 0, 440, 1, prefill_cached_pairs=56 * 384)) == pytest.approx(0.01 + 0.021504)
    assert model.step_time(StepShape(0, 4, 2000, 4)) == pytest.approx(0.01)


def test_a_profile_without_the_newer_terms_reads_them_as_zero(tmp_path):
    old = {t: 1e-3 for t in LINEAR_TERMS if t not in OPTIONAL_TERMS}
    (tmp_path / "p.json").write_text(json.dumps({"kind": "linear", "name": "old", "coefficients": old}))
    model = load_linear_profile(tmp_path / "p.json")
    assert all(model.coefficients[t] == 0.0 for t in OPTIONAL_TERMS)


def test_noisy_fit_reports_its_error(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl", noise=0.1)
    shapes, durations = read_trace_shapes(tmp_path / "t.jsonl")
    model = fit_linear(shapes, durations, "noisy")
    # the prefill terms trade with one another under noise; what a step of them costs stays close
    step = StepShape(1024, 0, 1024, 2, prefill_new_pairs=2 * 512 * 513 // 2)
    truth = float(np.dot(step.features(KNEE), [TRUE[t] for t in LINEAR_TERMS]))
    assert model.step_time(step) == pytest.approx(truth, rel=0.15)
    assert 0.8 < model.fit["r2"] < 1.0 and 0.03 < model.fit["median_rel_error"] < 0.15


def test_a_term_the_trace_never_varies_is_zero():
    shapes = [StepShape(0, d, 10 * d, d) for d in range(1, 30)]
    durations = np.asarray([0.01 + 0.001 * s.num_decode_rows for s in shapes])
    model = fit_linear(shapes, durations, "decode-only")
    assert model.coefficients["per_prefill_token_s"] == 0.0
    assert "per_prefill_token_s" in model.fit["unfitted_terms"]
    assert model.step_time(StepShape(0, 10, 100, 10)) == pytest.approx(0.02)


def test_an_old_trace_is_an_error_that_says_so(tmp_path):
    (tmp_path / "old.jsonl").write_text(json.dumps({"time": 1.0, "num_prefill_tokens": 3, "num_decode_tokens": 0,
                                                    "num_running": 1, "num_waiting": 0, "num_preempted": 0,
                                                    "kv_blocks_used": 1, "kv_usage": 0.1}) + "\n")
    with pytest.raises(ValueError, match="predates the cost fields"):
        read_trace_shapes(tmp_path / "old.jsonl")


def test_no_term_fits_negative_and_prefill_steps_stay_costly():
    """Decode rows and batch size move together in decode-only steps; an unconstrained fit can trade a large
    positive weight on one for a large negative one on the other, which predicts a lone prefill step at
    less than nothing. The non-negative fit holds such a term at 0."""
    rng = np.random.default_rng(3)
    shapes, durations = [], []
    for _ in range(300):
        rows = int(rng.integers(1, 40))
        prefill_requests = int(rng.integers(0, 3))
        prefill = int(rng.integers(16, 512)) * prefill_requests
        shape = StepShape(prefill, rows, 200 * rows + prefill, rows + prefill_requests)
        shapes.append(shape)
        # requests that prefill cost less than nothing beyond their tokens: a fitted negative weight
        durations.append(0.01 + 6e-4 * prefill + 3e-4 * rows - 2e-3 * prefill_requests
                         + 0.002 * rng.standard_normal() ** 2)
    model = fit_linear(shapes, np.asarray(durations), "collinear", weighting="relative")
    assert all(v >= 0.0 for v in model.coefficients.values())
    assert "per_request_s" in model.fit["zeroed_terms"]
    assert model.fit["weighting"] == "relative"
    assert model.step_time(StepShape(24, 0, 24, 1)) > 0.01


def test_unknown_weighting_is_an_error():
    shapes = [StepShape(0, d, 10 * d, d) for d in range(1, 30)]
    with pytest.raises(ValueError, match="weighting must be one of"):
        fit_linear(shapes, np.ones(len(shapes)), "x", weighting="squared")


def test_the_measured_api_server_time_is_kept_in_the_profile(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    calibrate(tmp_path / "t.jsonl", tmp_path / "p.json", "with-api", api_server_s=0.0021, api_server_burst_s=0.0013)
    profile = load_linear_profile(tmp_path / "p.json")
    assert profile.api_server_s == pytest.approx(0.0021) and profile.api_server_burst_s == pytest.approx(0.0013)
    assert load_linear_profile(tmp_path / "p.json").coefficients["fixed_s"] == pytest.approx(TRUE["fixed_s"])


def test_without_the_newer_terms_a_step_costs_what_the_straight_line_says():
    """The new-pairs and below-knee terms at 0 (an older profile, ``--prefill-knee 0``) price every step
    as the straight line in prefill tokens did; with them, a small step costs more per token than a big one."""
    line = {**dict.fromkeys(LINEAR_TERMS, 0.0), "fixed_s": 0.01, "per_prefill_token_s": 5e-4,
            "per_prefill_step_s": 0.02}
    old = LinearCostModel("line", line)
    bent = LinearCostModel("bent", {**line, "per_prefill_token_below_knee_s": 2e-4, "per_prefill_new_pair_s": 1e-9},
                           prefill_knee_tokens=512)
    step = StepShape(2048, 8, 3000, 16, prefill_new_pairs=8 * 256 * 257 // 2)
    assert old.step_time(step) == pytest.approx(0.01 + 0.02 + 5e-4 * 2048)
    assert bent.step_time(step) == pytest.approx(old.step_time(step) + 2e-4 * 512 + 1e-9 * (8 * 256 * 257 // 2))
    small, big = StepShape(64, 0, 64, 1), StepShape(1536, 0, 1536, 1)
    def per_token(model, shape):  # beyond a one-token step
        return (model.step_time(shape) - model.step_time(StepShape(1, 0, 1, 1))) / (shape.num_prefill_tokens - 1)

    assert per_token(bent, small) > per_token(bent, big) and per_token(old, small) == pytest.approx(per_token(old, big))


def test_a_below_knee_weight_without_a_knee_is_an_error():
    with pytest.raises(ValueError, match="prefill_knee_tokens"):
        LinearCostModel("x", {**dict.fromkeys(LINEAR_TERMS, 0.0), "per_prefill_token_below_knee_s": 1e-4})


def test_knee_zero_fits_a_straight_line(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    shapes, durations = read_trace_shapes(tmp_path / "t.jsonl")
    model = fit_linear(shapes, durations, "line", knee=0)
    assert model.prefill_knee_tokens == 0 and model.coefficients["per_prefill_token_below_knee_s"] == 0.0
    assert "per_prefill_token_below_knee_s" not in model.fit["unfitted_terms"]
    assert model.fit["r2"] < 1.0  # the trace bends at 512 tokens; a straight line cannot follow it
    with pytest.raises(ValueError, match="knee must be"):
        fit_linear(shapes, durations, "x", knee="sometimes")


def test_the_fit_is_the_best_nonnegative_one():
    """Against every subset of terms solved by plain least squares: the active-set solution is the best
    of the non-negative ones."""
    import itertools

    from folovllm.simulator.calibrate import nonnegative_lstsq

    rng = np.random.default_rng(7)
    features = rng.random((60, 5))
    targets = features @ np.array([1.0, -2.0, 0.5, 0.0, -0.3]) + 0.05 * rng.standard_normal(60)
    weights = nonnegative_lstsq(features, targets)
    assert (weights >= 0).all()
    best = np.inf
    for size in range(6):
        for subset in itertools.combinations(range(5), size):
            trial = np.zeros(5)
            if subset:
                trial[list(subset)], *_ = np.linalg.lstsq(features[:, subset], targets, rcond=None)
            if (trial >= 0).all():
                best = min(best, float(((features @ trial - targets) ** 2).sum()))
    assert float(((features @ weights - targets) ** 2).sum()) == pytest.approx(best, rel=1e-9)


def test_the_fit_reports_its_error_per_prefill_size(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    shapes, durations = read_trace_shapes(tmp_path / "t.jsonl")
    model = fit_linear(shapes, durations, "x", knee=0)
    buckets = model.fit["by_prefill_tokens"]
    assert sum(b["steps"] for b in buckets) == len(shapes)
    assert buckets[0]["prefill_tokens"] == [0, 1] and abs(buckets[-1]["rel_error"]) > 1e-3  # the line misses


def test_traced_steps_priced_by_a_profile_name_the_bucket_it_misprices(tmp_path):
    synthetic_trace(tmp_path / "t.jsonl")
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    exact = calibrate(tmp_path / "t.jsonl", tmp_path / "p.json", "exact")
    assert price_steps(exact, records)["predicted_s"] == pytest.approx(price_steps(exact, records)["measured_s"])
    for record in records:  # the engine got 30 % slower on big prefill steps only
        if record["num_prefill_tokens"] >= 1536:
            record["duration_s"] *= 1.3
    check = price_steps(exact, records)
    errors = {tuple(b["prefill_tokens"]): b["rel_error"] for b in check["by_prefill_tokens"]}
    assert errors[(1536, None)] == pytest.approx(1 / 1.3 - 1)
    assert all(abs(e) < 1e-6 for bucket, e in errors.items() if bucket != (1536, None))
