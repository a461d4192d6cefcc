"""scripts/gpu_check.sh's own logic, dry (nothing runs): the step order, the stop after a failed smoke or
environment step, the limits that keep one device call under 9 minutes, the bench's time limit, the matrix's
CUDA cases, and the carried wheels' list."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["wheels", "env", "smoke", "bench", "tests", "matrix"]


def dry_run(tmp_path: Path, *args: str, fail: str = "") -> tuple[int, list[tuple[str, int, str]], str]:
    """Exit status, (step, limit s, command) of each step started, and the summary's text."""
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_FAIL": fail}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    summary = (tmp_path / "summary.txt").read_text()
    started = [(m[0], int(m[1]), m[2]) for m in re.findall(r"^== (\w+) \(limit (\d+) s\): (.*)$", summary, re.M)]
    return proc.returncode, started, summary


def test_every_step_runs_in_order_within_nine_minutes(tmp_path: Path) -> None:
    status, started, summary = dry_run(tmp_path)
    assert status == 0 and [name for name, _, _ in started] == STEPS
    assert sum(limit for _, limit, _ in started) + 5 * len(started) <= 9 * 60  # each limit + its kill grace
    commands = {name: command for name, _, command in started}
    assert "gpu_bench.py --time-limit" in commands["bench"] and str(tmp_path) in commands["bench"]
    bench_limit = int(re.search(r"--time-limit (\d+)", commands["bench"])[1])
    assert bench_limit < dict((n, lim) for n, lim, _ in started)["bench"]  # the bench saves before it is killed
    assert "-x" in commands["smoke"].split() and "test_gpu_vs_transformers.py" in commands["smoke"]
    assert commands["matrix"].endswith("tests/matrix -k cuda")  # the device runs the CUDA cases alone
    assert f"--junitxml {tmp_path}/matrix-junit.xml" in commands["matrix"]
    assert summary.count("passed in") == len(STEPS)


def test_the_rehearsal_runs_the_matrix_twins(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--rehearse", "matrix"], cwd=ROOT, env=env,
                   capture_output=True, text=True, timeout=60)
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^== matrix \(limit \d+ s\): .* tests/matrix$", summary, re.M)  # no -k: every case


def test_every_carried_wheel_is_pinned() -> None:
    """The device installs the list with --no-deps: a version the CPU venv never ran must not slip in."""
    lines = [line.strip() for line in (ROOT / "benchmarks/gpu/carried-wheels.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9_.]*", pin) for pin in pins)


@pytest.mark.parametrize("failing", ["env", "smoke"])
def test_a_failed_environment_or_smoke_stops_the_run(tmp_path: Path, failing: str) -> None:
    status, started, summary = dry_run(tmp_path, fail=failing)
    assert status != 0 and [name for name, _, _ in started] == STEPS[:STEPS.index(failing) + 1]
    assert f"== {failing}: FAILED" in summary


def test_a_failed_bench_still_runs_the_tests_and_fails_the_run(tmp_path: Path) -> None:
    status, started, _ = dry_run(tmp_path, fail="bench")
    assert status != 0 and [name for name, _, _ in started] == STEPS


def test_one_part_runs_after_the_environment_checks(tmp_path: Path) -> None:
    status, started, _ = dry_run(tmp_path, "bench")
    assert status == 0 and [name for name, _, _ in started] == ["wheels", "env", "bench"]
    status, started, _ = dry_run(tmp_path, "matrix")
    assert status == 0 and [name for name, _, _ in started] == ["wheels", "env", "matrix"]


def test_an_unknown_argument_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--nonsense"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown argument" in proc.stderr


def test_the_matrix_result_records_each_case_the_device_and_versions(tmp_path: Path) -> None:
    (tmp_path / "matrix-junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.matrix.test_matrix_kv" name="test_a[cuda]"/>'
        '<testcase classname="tests.matrix.test_matrix_kv" name="test_b[cuda]"><failure message="assert 1 == 2">'
        'trace</failure></testcase><testcase classname="tests.matrix.test_matrix_kv" name="test_a[cpu]">'
        '<skipped message="deselected here"/></testcase></testsuite></testsuites>')
    (tmp_path / "env.log").write_text("name, memory.total [MiB]\nNVIDIA H200, 143771 MiB\ncores: 16\nNVIDIA H200\n"
                                      "{'python': '3.12.3', 'torch': '2.11.0+cu130', 'cuda': '13.0'}\n")
    (tmp_path / "summary.txt").write_text("== matrix (limit 150 s): pytest\n== matrix: FAILED (status 1) in 97 s\n")
    output = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_matrix_result.py", str(tmp_path), "--output", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1  # a case failed
    result = json.loads(output.read_text())
    assert result["device"].startswith("NVIDIA H200") and result["versions"]["torch"] == "2.11.0+cu130"
    assert result["duration_s"] == 97 and result["counts"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert result["cases"]["tests/matrix/test_matrix_kv.py::test_b[cuda]"] == "failed: assert 1 == 2"
