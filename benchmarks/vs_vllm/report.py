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


def is_vllm(engine: str) -> bool:
    """Engine names are variants: ``vllm``, ``vllm-fp32``, ``folo``, ``folo-q4``, ..."""
    return engine.split("-")[0] == "vllm"


def pick(values: dict[str, float], vllm: bool, higher_is_better: bool) -> float:
    """The best vLLM figure, or ours: the default variant's (``folo``) where it ran, else our best."""
    if not vllm and "folo" in values:
        return values["folo"]
    mine = [v for e, v in values.items() if is_vllm(e) == vllm]
    if not mine:
        raise ValueError(f"no {'vLLM' if vllm else 'FoloVLLM'} figure among {sorted(values)}")
    return max(mine) if higher_is_better else min(mine)


def row(label: str, metric: str, by_engine: dict[str, float], higher_is_better: bool) -> dict[str, Any]:
    """One line of the table: every engine's figure, and ours against vLLM's best."""
    vllm, folo = pick(by_engine, True, higher_is_better), pick(by_engine, False, higher_is_better)
    return {"label": label, "metric": metric, "by_engine": dict(by_engine), "vllm": vllm, "folo": folo,
            "higher_is_better": higher_is_better, "advantage": advantage(vllm, folo, higher_is_better)}


def table_rows(offline: dict[str, Any] | None, serve: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The table's lines from the offline and server phases' results (either may be missing)."""
    rows = []
    if offline:
        for wl in offline["workloads"]:
            rows.append(row(f"offline {wl['shape']}", wl["figure"], wl["median"], wl["higher_is_better"]))
    if serve:
        shape = serve["shape"]
        for rate, by_engine in serve["median"].items():
            label = f"server {shape['num_prompts']} × {shape['input_len']} × {shape['output_len']}, rate {rate}"
            rows.append(row(label, "output tok/s", {e: f["output_tok_s"] for e, f in by_engine.items()}, True))
            rows.append(row(label, "mean TPOT ms", {e: f["tpot_ms_mean"] for e, f in by_engine.items()}, False))
    for name, phase in (("offline", offline), ("server", serve)):
        if phase:
            rows.append(row(f"{name} start-up", "s from spawn to first token",
                            {e: info["first_token_s"] for e, info in phase["startup"].items()}, False))
            rows.append(row(f"{name}, whole run", "peak RSS MiB (process tree)", phase["peak_rss_mib"], False))
    return rows


def fmt_value(value: float) -> str:
    """Three significant figures or so: 1,151 / 25.9 / 6.02."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def format_table(rows: Sequence[dict[str, Any]], labels: dict[str, str] | None = None) -> str:
    """The markdown table: workload, figure, each engine's figure, ours vs vLLM's best (> 1: FoloVLLM ahead).
    ``labels`` names the engine variants' columns (rows of an older result hold vLLM's and ours only)."""
    labels = labels or {"vllm": "vLLM", "folo": "FoloVLLM"}
    engines = list(rows[0].get("by_engine", labels)) if rows else list(labels)
    head = " | ".join(labels.get(e, e) for e in engines)
    lines = [f"| workload | figure | {head} | FoloVLLM vs vLLM's best |", "|---|---|" + "---|" * len(engines) + "---|"]
    for r in rows:
        better = "higher" if r["higher_is_better"] else "lower"
        values = r.get("by_engine", {"vllm": r["vllm"], "folo": r["folo"]})
        cells = " | ".join(fmt_value(values[e]) if e in values else "–" for e in engines)
        lines.append(f"| {r['label']} | {r['metric']} ({better} is better) | {cells} | {r['advantage']:.2f}× |")
    return "\n".join(lines) + "\n"


def llama_rows(llama: dict[str, Any]) -> list[dict[str, Any]]:
    """The llama.cpp table's lines: per stream count, generation tok/s (llama.cpp's S_TG; ours over the whole
    run, and over the decode phase alone where the run has it), and for one stream ms per token (likewise);
    each with ours (on the same GGUF, and our best) against llama.cpp's."""
    rows = []
    for name, by_side in llama["median"].items():
        n = int(name.split("_")[1])
        shape = f"{n} × {llama['shape']['prompt']} × {llama['shape']['generate']}"
        figures = [("output tok/s", "value", True), ("decode tok/s, prompts excluded", "decode_tok_s", True)]
        if n == 1:
            figures += [("ms per token", "ms_per_step", False),
                        ("ms per decode step, prompts excluded", "decode_ms_per_step", False)]
        for metric, key, higher in figures:
            if any(key not in f for f in by_side.values()):  # a run from before the decode phase was timed
                continue
            values = {side: f[key] for side, f in by_side.items()}
            theirs = values["llama.cpp"]
            ours = {e: v for e, v in values.items() if e != "llama.cpp"}
            # ours on llama.cpp's own file: with default flags where that ran, else with load_quantized on
            gguf = next((e for e in ("folo-gguf", "folo-q4") if e in values), None)
            best = max(ours.values()) if higher else min(ours.values())
            rows.append({"label": f"{n} stream{'s' if n > 1 else ''}, {shape}", "metric": metric,
                         "by_engine": values, "higher_is_better": higher,
                         "four_bit": advantage(theirs, values[gguf], higher) if gguf else None,
                         "best": advantage(theirs, best, higher)})
    return rows


def format_llama_table(rows: Sequence[dict[str, Any]], labels: dict[str, str]) -> str:
    """The markdown table of llama.cpp against our variants."""
    sides = list(rows[0]["by_engine"])
    head = " | ".join(labels.get(e, e) for e in sides)
    lines = [f"| streams × prompt × new | figure | {head} | ours on its GGUF vs llama.cpp | our best vs llama.cpp |",
             "|---|---|" + "---|" * len(sides) + "---|---|"]
    for r in rows:
        better = "higher" if r["higher_is_better"] else "lower"
        cells = " | ".join(fmt_value(r["by_engine"][e]) for e in sides)
        four = f"{r['four_bit']:.2f}×" if r["four_bit"] is not None else "–"
        lines.append(f"| {r['label']} | {r['metric']} ({better} is better) | {cells} | {four} | {r['best']:.2f}× |")
    return "\n".join(lines) + "\n"


def format_rss(phase: dict[str, Any], labels: dict[str, str]) -> str:
    """One line: each side's peak RSS in a phase (and the GGUF's size, where it ran on one)."""
    sides = ", ".join(f"{labels.get(e, e)} {mib / 1024:.2f} GiB" for e, mib in phase["peak_rss_mib"].items())
    size = f" (the GGUF: {phase['gguf_mib'] / 1024:.2f} GiB)" if "gguf_mib" in phase else ""
    return f"peak RSS: {sides}{size}\n"


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
    if result.get("machine", {}).get("tier"):
        t = result["machine"]["tier"]
        ran_vllm = bool(result.get("versions", {}).get("vllm"))  # not in a llama.cpp-only run
        lines.append(f"CPU tier: host {t['host']}; FoloVLLM ran at {t['folovllm']}"
                     + (f", vLLM at {t['vllm']}" if ran_vllm else "")
                     + (f", llama.cpp's {result['llama_cpp']['tier']} build" if result.get("llama_cpp") else "") + ".")
    if result.get("offline") and result["offline"]["greedy_match"]:
        check, loads = result["offline"]["greedy_match"]["check_prompts"], result["offline"]["greedy_match"]["workloads"]
        pair = " and ".join(result["offline"]["greedy_match"].get("engines", ["vllm", "folo"]))
        lines.append(f"Greedy agreement ({pair}): {check['identical']}/{check['outputs']} text prompts give identical "
                     f"outputs ({check['token_match_rate']:.0%} of their tokens before a first divergence); "
                     f"{loads['identical']}/{loads['outputs']} random-id workload outputs are identical "
                     f"({loads['token_match_rate']:.0%} of tokens).")
    return "\n".join(lines)


def format_embed_table(phase: dict[str, Any], labels: dict[str, str]) -> str:
    shape = phase["shape"]
    lines = [f"Embeddings, {shape['num_inputs']} inputs x {shape['input_len']} tokens (median of rounds):", "",
             "| engine | input tok/s | inputs/s |", "|---|---|---|"]
    for e in phase["engines"]:
        lines.append(f"| {labels.get(e, e)} | {phase['median'][e]:,.1f} | {phase['median_inputs_s'][e]:,.2f} |")
    if phase["agreement"]:
        a = phase["agreement"]
        lines.append(f"\nvectors {a['engines'][0]} vs {a['engines'][1]}: min cosine {a['min_cosine']:.6f} "
                     f"over {a['num_compared']} inputs")
    return "\n".join(lines)


def format_gemm_shares(gemm: dict[str, Any], labels: dict[str, str]) -> str:
    """Each offline run's model GFLOP/s and its share of the host's GEMM limit."""
    lines = [f"GEMM limit here: {gemm['limit_gflop_s']:.0f} GFLOP/s ({gemm['by']}, {gemm['threads']} threads)", "",
             "| workload | engine | model GFLOP/s | of the limit |", "|---|---|---|---|"]
    for name, by_engine in gemm["workloads"].items():
        for engine, f in by_engine.items():
            lines.append(f"| {name} | {labels.get(engine, engine)} | {f['gflop_s']:.0f} | {f['share']:.0%} |")
    return "\n".join([*lines, ""])



# The sweep's bars on FoloVLLM vs vLLM's best (> 1: ahead), per kind of workload: (the median over its points
# at least, every point at least). One stream is judged by ms per token: at most 0.8x vLLM's is 1.25x here.
SWEEP_BARS: dict[str, tuple[float, float | None]] = {
    "decode": (1.3, 1.0), "variable": (1.3, 1.0), "prefill": (1.0, 0.9), "one_stream": (1 / 0.8, None)}
SWEEP_KINDS = {"decode": "batched decode", "variable": "variable lengths", "prefill": "prefill",
               "one_stream": "one stream"}


def sweep_rows(offline: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's lines: one per workload (a point), its kind beside the usual row."""
    return [{**row(wl["shape"], wl["figure"], wl["median"], wl["higher_is_better"]), "name": wl["name"],
             "kind": wl["kind"]} for wl in offline["workloads"]]


def beside_sweep(rows: Sequence[dict[str, Any]], sweep: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The table's rows a sweep's own table does not show already (start-up, memory, the server's)."""
    points = {f"offline {r['label']}" for r in sweep["rows"]} if sweep else set()
    return [r for r in rows if r["label"] not in points]


def sweep_summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind of workload: its points, the median and lowest advantage, the bar and whether it is met."""
    summary = {}
    for kind in SWEEP_KINDS:
        found = [r["advantage"] for r in rows if r["kind"] == kind]
        if not found:
            continue
        bar_median, bar_floor = SWEEP_BARS[kind]
        mid, low = median(found), min(found)
        summary[kind] = {"points": len(found), "median": mid, "lowest": low, "bar_median": bar_median,
                         "bar_lowest": bar_floor, "met": mid >= bar_median and (bar_floor is None or low >= bar_floor)}
    return summary


def format_sweep(rows: Sequence[dict[str, Any]], summary: dict[str, dict[str, Any]],
                 labels: dict[str, str]) -> str:
    """The sweep's markdown tables: every point, then each kind's median and lowest against its bar."""
    engines = list(rows[0]["by_engine"])
    head = " | ".join(labels.get(e, e) for e in engines)
    lines = [f"| kind | requests × prompt × new | figure | {head} | FoloVLLM vs vLLM's best |",
             "|---|---|---|" + "---|" * len(engines) + "---|"]
    for r in sorted(rows, key=lambda r: list(SWEEP_KINDS).index(r["kind"])):
        better = "higher" if r["higher_is_better"] else "lower"
        cells = " | ".join(fmt_value(r["by_engine"][e]) if e in r["by_engine"] else "–" for e in engines)
        lines.append(f"| {SWEEP_KINDS[r['kind']]} | {r['label']} | {r['metric']} ({better} is better) | {cells} | "
                     f"{r['advantage']:.2f}× |")
    lines += ["", "| kind | points | median | lowest | bar: median / lowest | met |", "|---|---|---|---|---|---|"]
    for kind, s in summary.items():
        floor = "–" if s["bar_lowest"] is None else f"{s['bar_lowest']:.2f}×"
        lines.append(f"| {SWEEP_KINDS[kind]} | {s['points']} | {s['median']:.2f}× | {s['lowest']:.2f}× | "
                     f"{s['bar_median']:.2f}× / {floor} | {'yes' if s['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def format_sweep_runs(results: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Several sweeps side by side, one line per run (each kind's median, its lowest point in brackets), for
    the tiers of one host or the runs of one tier; ``names`` label the runs (their files, or numbers)."""
    kinds = [k for k in SWEEP_KINDS if any(k in r["sweep"]["summary"] for r in results)]
    lines = ["| run | tiers: ours / vLLM | vLLM's variants | " + " | ".join(SWEEP_KINDS[k] for k in kinds)
             + " | every bar met |", "|---|---|---|" + "---|" * len(kinds) + "---|"]
    for name, r in zip(names, results):
        tier, summary = r["machine"]["tier"], r["sweep"]["summary"]
        vllm = ", ".join(e for e in r["sweep"]["rows"][0]["by_engine"] if is_vllm(e))
        cells = [f"{summary[k]['median']:.2f}× ({summary[k]['lowest']:.2f}×)" if k in summary else "–" for k in kinds]
        met = "yes" if all(s["met"] for s in summary.values()) else "no"
        lines.append(f"| {name} | {tier['folovllm']} / {tier['vllm'].split(' ')[0]} | {vllm} | "
                     + " | ".join(cells) + f" | {met} |")
    return "\n".join(lines) + "\n"
