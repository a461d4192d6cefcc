"""scripts/host_overhead.py runs and reports every stage."""
import subprocess
import sys


def test_host_overhead_script_reports_stages():
    proc = subprocess.run([sys.executable, "scripts/host_overhead.py", "--batch", "4", "--steps", "5"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "outside the forward" in proc.stdout
    for stage in ("schedule", "prepare inputs", "append tokens + stops", "build outputs", "message to the server"):
        assert stage in proc.stdout
