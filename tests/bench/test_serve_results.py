"""bench serve metrics on synthetic timestamps: TPOT, pooled ITL, window, goodput, classes, failures."""
import pytest

from folovllm.bench.datasets import ServeRequest
from folovllm.bench.serve_client import RequestOutcome
from folovllm.bench.serve_results import (
    build_serve_result,
    format_serve_result,
    meets_slos,
    parse_goodput,
)


def outcome(send, chunks, out_tokens=None, tag="", error=None, prompt_tokens=10):
    req = ServeRequest([1] * prompt_tokens, 8, prompt_tokens, tag=tag)
    end = chunks[-1] if chunks and error is None else send + 0.5
    return RequestOutcome(req, send, end, list(chunks), prompt_tokens,
                          len(chunks) if out_tokens is None else out_tokens, error)


def build(outcomes, slos=None):
    return build_serve_result(outcomes, name="t", engine="folovllm", model="m", config={}, slos=slos)


def test_ttft_tpot_itl_e2el_definitions():
    # Request A: sent at 0, tokens at 0.1, 0.3, 0.6 → TTFT 100, TPOT (0.6-0.1)/2 = 250, ITL 200 & 300.
    # Request B: sent at 1.0, 4 tokens over chunks at 1.2, 1.4 (two tokens per chunk) → TPOT 0.2/3.
    a = outcome(0.0, [0.1, 0.3, 0.6])
    b = outcome(1.0, [1.2, 1.4], out_tokens=4)
    r = build([a, b])
    assert r["num_requests"] == 2 and r["failed_requests"] == 0
    assert r["duration_s"] == pytest.approx(1.4)  # first send → last finish
    assert r["output_tokens"] == 7 and r["input_tokens"] == 20
    assert r["output_tok_s"] == pytest.approx(7 / 1.4)
    assert r["total_tok_s"] == pytest.approx(27 / 1.4)
    assert r["request_throughput"] == pytest.approx(2 / 1.4)
    assert r["ttft_ms"]["mean"] == pytest.approx(150) and r["ttft_ms"]["max"] == pytest.approx(200)
    assert r["tpot_ms"]["mean"] == pytest.approx((250 + 200 / 3) / 2)
    # ITL pools every gap between chunks over all requests: 200, 300, 200.
    assert r["itl_ms"]["mean"] == pytest.approx(700 / 3) and r["itl_ms"]["max"] == pytest.approx(300)
    assert r["e2el_ms"]["p50"] == pytest.approx(500) and r["e2el_ms"]["max"] == pytest.approx(600)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(r[key]) == {"mean", "p50", "p90", "p99", "max"}


def test_single_token_request_has_no_tpot_and_failures_are_counted_with_reasons():
    ok = outcome(0.0, [0.2])
    bad = [outcome(0.1, [], error="HTTP 400: too long"), outcome(0.2, [], error="HTTP 400: too long"),
           outcome(0.3, [], error="ConnectError: refused")]
    r = build([ok, *bad])
    assert r["num_requests"] == 1 and r["failed_requests"] == 3
    assert r["failures"] == {"HTTP 400: too long": 2, "ConnectError: refused": 1}
    assert r["tpot_ms"] is None and r["itl_ms"] is None
    assert r["duration_s"] == pytest.approx(0.8)  # the last failure was seen at 0.3 + 0.5
    text = format_serve_result(r)
    assert "Failed requests:" in text and "2 × HTTP 400: too long" in text


def test_goodput_counts_requests_meeting_every_slo():
    fast = outcome(0.0, [0.05, 0.10, 0.15])     # TTFT 50, TPOT 50, E2EL 150
    slow_ttft = outcome(0.0, [0.5, 0.55])       # TTFT 500
    slow_tpot = outcome(0.0, [0.05, 0.25])      # TPOT 200
    one_token = outcome(0.0, [0.08])            # TPOT undefined: cannot miss
    r = build([fast, slow_ttft, slow_tpot, one_token], slos=parse_goodput(["ttft:100", "tpot:60"]))
    assert r["goodput"]["good_requests"] == 2
    assert r["goodput"]["request_goodput"] == pytest.approx(2 / 0.55)
    assert "Request goodput (req/s):" in format_serve_result(r)
    assert meets_slos(fast.timing(), {"e2el": 150.001}) and not meets_slos(fast.timing(), {"e2el": 149})


def test_parse_goodput_forms_and_errors():
    assert parse_goodput(["ttft:200,tpot:50"]) == {"ttft": 200.0, "tpot": 50.0}
    assert parse_goodput(["e2el:1e3"]) == {"e2el": 1000.0}
    assert parse_goodput(None) == {}
    for bad in (["itl:5"], ["ttft"], ["ttft:fast"], ["tpot:0"]):
        with pytest.raises(ValueError, match="goodput"):
            parse_goodput(bad)


def test_per_class_breakdown():
    outs = [outcome(0.0, [0.1, 0.2], tag="short"), outcome(0.0, [0.9, 1.0], tag="long"),
            outcome(0.0, [], tag="long", error="HTTP 503: busy")]
    r = build(outs)
    assert set(r["classes"]) == {"short", "long"}
    assert r["classes"]["short"]["ttft_ms"]["mean"] == pytest.approx(100)
    assert r["classes"]["long"]["ttft_ms"]["mean"] == pytest.approx(900)
    assert r["classes"]["long"]["failed_requests"] == 1 and r["classes"]["long"]["num_requests"] == 1
    assert "class long:" in format_serve_result(r)
    assert "classes" not in build([outcome(0.0, [0.1])])


def test_a_run_where_every_request_failed_still_reports():
    r = build([outcome(0.0, [], error="HTTP 503: busy"), outcome(0.1, [], error="HTTP 503: busy")])
    assert r["num_requests"] == 0 and r["failed_requests"] == 2 and r["output_tokens"] == 0
    assert all(r[k] is None for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"))
    assert "2 × HTTP 503: busy" in format_serve_result(r)
    with pytest.raises(ValueError, match="no requests"):
        build([])


def test_vllm_result_keys_alongside_ours():
    from folovllm.bench.serve_results import (
        parse_metric_percentiles,
        parse_percentile_metrics,
        vllm_result_fields,
    )

    outcomes = [outcome(0.0, [0.1, 0.2, 0.4]), outcome(0.0, [0.2, 0.3, 0.4]), outcome(0.0, [], error="HTTP 500")]
    result = build(outcomes)
    fields = vllm_result_fields(outcomes, result, parse_percentile_metrics("ttft,itl,e2el"),
                                parse_metric_percentiles("50,99.9"))
    assert (fields["completed"], fields["failed"], fields["total_output_tokens"]) == (2, 1, 6)
    assert fields["output_throughput"] == result["output_tok_s"] and fields["duration"] == result["duration_s"]
    assert fields["mean_ttft_ms"] == pytest.approx(150.0) and fields["median_ttft_ms"] == pytest.approx(150.0)
    assert fields["p50_ttft_ms"] == pytest.approx(150.0) and "p99.9_itl_ms" in fields
    assert fields["std_ttft_ms"] == pytest.approx(50.0) and "mean_tpot_ms" not in fields
    assert fields["ttfts"] == pytest.approx([0.1, 0.2, 0.0]) and fields["errors"] == ["", "", "HTTP 500"]
    assert fields["itls"][0] == pytest.approx([0.1, 0.2])
    with pytest.raises(ValueError, match="percentile-metrics"):
        parse_percentile_metrics("ttft,latency")
    with pytest.raises(ValueError, match="metric-percentiles"):
        parse_metric_percentiles("0")
