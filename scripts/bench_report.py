"""Prints the throughput tables of docs/benchmarks.md from the saved result JSON (no hand-typed figures).

    .venv/bin/python scripts/bench_report.py docs/results/throughput-*.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def table(path: Path) -> str:
    runs = json.loads(path.read_text())
    ours = runs[0]
    lines = [f"**{ours['name']}** — {ours['num_requests']} requests, `{path.as_posix()}`", "",
             "| engine | requests | input tok/s | output tok/s | TTFT mean ms | TPOT mean ms | peak RSS MiB | ours/theirs (output tok/s) |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        ratio = "" if run is ours else f"{ours['output_tok_s'] / run['output_tok_s']:.2f}×"
        lines.append(
            f"| {run['engine']} | {run['num_requests']} | {fmt(run['input_tok_s'])} | {fmt(run['output_tok_s'])} "
            f"| {fmt((run['ttft_ms'] or {}).get('mean'))} | {fmt((run['tpot_ms'] or {}).get('mean'))} "
            f"| {fmt(run['peak_memory_mb'], 0)} | {ratio} |")
    extra = ours.get("extra", {})
    static = next((r for r in runs if r["engine"] == "hf-static"), None)
    if static is not None and ours["name"] == "prefill-heavy":
        hf_prefill = static.get("extra", {}).get("prefill_tok_s")
        lines += ["", f"Prefill rate: ours {fmt(extra.get('prefill_tok_s'))} tok/s, HF batched prefill "
                      f"{fmt(hf_prefill)} tok/s; our whole-run input tok/s / HF batched prefill = "
                      f"{ours['input_tok_s'] / hf_prefill:.2f}×."]
    kv = ours["kv_cache"]
    lines += ["", f"KV cache: {kv['num_blocks']} blocks × {kv['block_size']} tokens; peak {kv['peak_blocks_used']} "
                  f"blocks in use holding {kv['peak_used_slots']} tokens = {kv['slot_utilization']:.1%} of their "
                  f"slots. CPU share of the run: {fmt(extra.get('cpu_share'), 2)}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n".join(table(Path(p)) for p in sys.argv[1:]))
