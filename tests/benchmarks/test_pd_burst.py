"""benchmarks/pd_burst.py's options (the runs themselves launch servers: see docs/distributed.md)."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pd_burst.py"


@pytest.fixture(scope="module")
def pd_burst():
    spec = importlib.util.spec_from_file_location("pd_burst", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pd_burst"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_configs_and_a_sweep_of_burst_intervals_parse(pd_burst):
    args = pd_burst.parse_args(["--configs", "a,b", "--duration", "5", "--burst-intervals", "2,3.5"])
    assert args.intervals == [2.0, 3.5] and args.configs == "a,b" and args.model is None


@pytest.mark.parametrize("argv,match", [(["--configs", "a,x"], "--configs takes letters"),
                                        (["--burst-intervals", "0"], "must be positive"),
                                        (["--burst-intervals", "two"], "comma-separated seconds"),
                                        (["--repeats", "0"], "must be positive"),
                                        (["--pd-front-cpus", "zero"], "comma-separated core numbers"),
                                        (["--pd-front-cpus", "100000"], "may use only cores")])
def test_bad_options_say_what_to_give(pd_burst, argv, match):
    with pytest.raises(ValueError, match=match):
        pd_burst.parse_args(argv)


def test_repeats_and_the_front_end_cores_parse(pd_burst):
    args = pd_burst.parse_args(["--repeats", "3", "--pd-front-cpus", "0"])
    assert args.repeats == 3 and args.front_cpus == {0}
    assert pd_burst.parse_args([]).front_cpus == set() and pd_burst.parse_args([]).repeats == 1


def test_pd_step_traces_go_to_one_file_per_role(pd_burst, tmp_path):
    assert pd_burst.trace_args(pd_burst.parse_args([]), "consumer") == []
    args = pd_burst.parse_args(["--pd-trace-dir", str(tmp_path / "traces")])
    assert pd_burst.trace_args(args, "consumer") == ["--trace", str(tmp_path / "traces" / "consumer.jsonl")]
    assert (tmp_path / "traces").is_dir()


def test_each_server_gets_the_shared_flags_and_its_own(pd_burst):
    args = pd_burst.parse_args(["tiny.gguf", "--serve-args", "--dtype float32"])
    cmd = pd_burst.serve_cmd(args, 8100, "--num-threads", "1")
    assert cmd[3:5] == ["serve", "tiny.gguf"] and cmd[-4:] == ["--dtype", "float32", "--num-threads", "1"]


def test_transfer_figures_come_from_the_consumers_counters(pd_burst, monkeypatch):
    text = "\n".join([
        "# TYPE vllm:kv_transfer_loads counter", 'vllm:kv_transfer_loads_total{engine="0"} 6.0',
        "# TYPE vllm:kv_transfer_recv_bytes counter", 'vllm:kv_transfer_recv_bytes_total{engine="0"} 6291456.0',
        "# TYPE vllm:kv_transfer_recv_seconds counter", 'vllm:kv_transfer_recv_seconds_total{engine="0"} 0.3',
        "# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0"} 2.0', ""])
    monkeypatch.setattr(pd_burst.httpx, "get", lambda url, timeout: type("R", (), {"text": text})())
    after = pd_burst.kv_transfer_counters("http://d")
    assert after == {"loads": 6.0, "bytes": 6291456.0, "seconds": pytest.approx(0.3)}
    figures = pd_burst.transfer_figures({"loads": 2.0, "bytes": 2097152.0, "seconds": 0.1}, after)
    assert figures == {"transfers": 4, "total_mb": 4.0, "mean_mb": 1.0, "mean_ms": pytest.approx(50.0)}
    none = pd_burst.transfer_figures(after, after)
    assert none["transfers"] == 0 and none["mean_ms"] is None
