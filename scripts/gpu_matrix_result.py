"""The feature matrix's result from a GPU check's output folder, as a docs/results/ JSON: each case's outcome
(passed, failed, or skipped with its reason), the device and the versions the run saw, and the command.

    python scripts/gpu_matrix_result.py OUT_DIR --output docs/results/gpu-matrix-h200.json

OUT_DIR is what `scripts/gpu_check.sh` wrote ($OUT on the device, build/gpu-rehearsal for `make gpu-rehearsal`):
its matrix-junit.xml (the matrix step's pytest report), env.log (the device and versions) and summary.txt.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def case_outcomes(junit: Path) -> dict[str, str]:
    """test id -> "passed", "failed: message", "error: message" or "skipped: reason"."""
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                message = (found.get("message") or "").strip().splitlines()
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                outcome += f": {message[0]}" if message else ""
                break
        outcomes[name] = outcome
    return outcomes


def environment(env_log: Path) -> dict[str, Any]:
    """The device line and the versions dict the environment step printed."""
    text = env_log.read_text()
    found: dict[str, Any] = {"device": None, "versions": None}
    for line in text.splitlines():
        if line.startswith("{") and "torch" in line:
            found["versions"] = ast.literal_eval(line)
        elif found["device"] is None and (line.startswith("NVIDIA") or line.startswith("rehearsal on CPU")):
            found["device"] = line.strip()
    return found


def matrix_duration_s(summary: Path) -> int | None:
    match = re.search(r"^== matrix: \w.* in (\d+) s$", summary.read_text(), re.M)
    return int(match[1]) if match else None


def build(out_dir: Path) -> dict[str, Any]:
    cases = case_outcomes(out_dir / "matrix-junit.xml")
    counts: dict[str, int] = {}
    for outcome in cases.values():
        kind = outcome.split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    return {"name": "gpu-matrix", **environment(out_dir / "env.log"), "duration_s": matrix_duration_s(out_dir / "summary.txt"),
            "counts": counts, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="the GPU check's output folder")
    parser.add_argument("--output", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--command", default="bash scripts/gpu_check.sh", help="what wrote OUT_DIR")
    args = parser.parse_args(argv)
    result = {"command": args.command,
              "recorded_by": f"python scripts/gpu_matrix_result.py {args.out_dir} --output {args.output}",
              **build(args.out_dir)}
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["counts"]), "->", args.output)
    return 1 if result["counts"].get("failed") or result["counts"].get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
