"""The pure parts of the comparison: a run's rates, medians, the FoloVLLM-vs-vLLM ratio, greedy
agreement, noise, and the markdown table (standard library only; also used by scripts/bench_report.py)."""
from __future__ import annotations

import statistics
from typing import Any, Sequence


def run_rates(wall_s: float, input_tokens: int, output_tokens: int) -> dict[str, float]:
    """The three figures a workload can be judged by."""
    if wall_s <= 0 or output_tokens < 1:
        raise ValueError(f"a run needs a positive wall time and output tokens, got {wall_s} s, {output_tokens}")
    return {"output_tok_s": output_tokens / wall_s, "input_tok_s": input_tokens / wall_s,
            "ms_per_output_token": 1000.0 * wall_s / output_tokens}


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("no runs to take the median of")
    return float(statistics.median(values))


def advantage(vllm: float, folo: float, higher_is_better: bool) -> float:
    """How FoloVLLM stands against vLLM on one figure: > 1 means FoloVLLM is ahead, 1 parity, whichever
    way the figure points (a rate: folo / vllm; a time or a size: vllm / folo)."""
    if vllm <= 0 or folo <= 0:
        raise ValueError(f"figures must be positive, got vLLM {vllm}, FoloVLLM {folo}")
    return folo / vllm if higher_is_better else vllm / folo


def row(label: str, metric: str, vllm: float, folo: float, higher_is_better: bool) -> dict[str, Any]:
    """One line of the table."""
    return {"label": label, "metric": metric, "vllm": vllm, "folo": folo, "higher_is_better": higher_is_better,
            "advantage": advantage(vllm, folo, higher_is_better)}


def table_rows(offline: dict[str, Any] | None, serve: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The table's lines from the offline and server phases' results (either may be missing)."""
    rows = []
    if offline:
        for wl in offline["workloads"]:
            rows.append(row(f"offline {wl['shape']}", wl["figure"], wl["median"]["vllm"], wl["median"]["folo"],
                            wl["higher_is_better"]))
    if serve:
        shape = serve["shape"]
        for rate, by_engine in serve["median"].items():
            label = f"server {shape['num_prompts']} × {shape['input_len']} × {shape['output_len']}, rate {rate}"
            rows.append(row(label, "output tok/s", by_engine["vllm"]["output_tok_s"],
                            by_engine["folo"]["output_tok_s"], True))
            rows.append(row(label, "mean TPOT ms", by_engine["vllm"]["tpot_ms_mean"],
                            by_engine["folo"]["tpot_ms_mean"], False))
    for name, phase in (("offline", offline), ("server", serve)):
        if phase:
            first = {e: phase["startup"][e]["first_token_s"] for e in ("vllm", "folo")}
            rows.append(row(f"{name} start-up", "s from spawn to first token", first["vllm"], first["folo"], False))
            rows.append(row(f"{name}, whole run", "peak RSS MiB (process tree)", phase["peak_rss_mib"]["vllm"],
                            phase["peak_rss_mib"]["folo"], False))
    return rows


def fmt_value(value: float) -> str:
    """Three significant figures or so: 1,151 / 25.9 / 6.02."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown table: workload, figure, vLLM, FoloVLLM, FoloVLLM vs vLLM (> 1: FoloVLLM ahead)."""
    lines = ["| workload | figure | vLLM | FoloVLLM | FoloVLLM vs vLLM |", "|---|---|---|---|---|"]
    for r in rows:
        better = "higher" if r["higher_is_better"] else "lower"
        lines.append(f"| {r['label']} | {r['metric']} ({better} is better) | {fmt_value(r['vllm'])} | "
                     f"{fmt_value(r['folo'])} | {r['advantage']:.2f}× |")
    return "\n".join(lines) + "\n"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(vllm: Sequence[Sequence[int]], folo: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far both engines' greedy outputs for the same prompts agree: the share of identical outputs,
    and how many leading tokens each pair shares (bf16 rounding can flip a late near-tie)."""
    if len(vllm) != len(folo) or not vllm:
        raise ValueError(f"need the same, non-zero number of outputs, got {len(vllm)} and {len(folo)}")
    prefixes = [common_prefix(a, b) for a, b in zip(vllm, folo)]
    identical = sum(list(a) == list(b) for a, b in zip(vllm, folo))
    return {"outputs": len(vllm), "identical": identical, "match_rate": identical / len(vllm),
            "common_prefix_tokens": prefixes, "output_tokens": [len(a) for a in vllm],
            "token_match_rate": sum(prefixes) / max(1, sum(max(len(a), len(b)) for a, b in zip(vllm, folo)))}


def noise(runs: Sequence[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """How disturbed the timed runs were: others' CPU share (of the whole machine) during the kept
    attempts, how many attempts were retried, and how many kept runs stayed over the threshold."""
    if not runs:
        raise ValueError("no runs")
    shares = [r["others_share"] for r in runs]
    return {"runs": len(runs), "others_share_median": median(shares), "others_share_max": max(shares),
            "retried_attempts": sum(len(r["attempt_shares"]) - 1 for r in runs),
            "kept_over_threshold": sum(s >= threshold for s in shares), "threshold": threshold,
            "waited_for_quiet_s": sum(r["waited_s"] for r in runs)}


def format_notes(result: dict[str, Any]) -> str:
    """The lines under the table: how noisy the machine was, how far the greedy outputs agree."""
    n = result["noise"]
    lines = [f"Noise: other processes took a median {n['others_share_median']:.0%} (at most "
             f"{n['others_share_max']:.0%}) of the CPUs during the {n['runs']} timed runs kept; "
             f"{n['retried_attempts']} disturbed attempts were retried, {n['kept_over_threshold']} kept runs stayed "
             f"over the {n['threshold']:.0%} threshold; {n['waited_for_quiet_s'] / 60:.1f} min went to waiting "
             "for a quiet machine."]
    for phase in ("offline", "serve"):
        if not result.get(phase):
            lines.append(f"The {'server' if phase == 'serve' else phase} phase is not in this result (see the command).")
    if result.get("offline"):
        check, loads = result["offline"]["greedy_match"]["check_prompts"], result["offline"]["greedy_match"]["workloads"]
        lines.append(f"Greedy agreement: {check['identical']}/{check['outputs']} text prompts give identical "
                     f"outputs ({check['token_match_rate']:.0%} of their tokens before a first divergence); "
                     f"{loads['identical']}/{loads['outputs']} random-id workload outputs are identical "
                     f"({loads['token_match_rate']:.0%} of tokens).")
    return "\n".join(lines)
