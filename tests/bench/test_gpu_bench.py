"""scripts/gpu_bench.py --smoke: the GPU benchmark's whole code path on CPU with a tiny Qwen3 config."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("hf_generate", "nano_vllm_offline", "decode_heavy", "prefill_heavy", "step_time", "decode_graph",
            "fused_ab", "overlap", "cuda_graphs", "attention_backends", "attention_kernels")


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and value > 0


@pytest.mark.slow
def test_smoke_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu-bench.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_bench.py", "--smoke", "--output-json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| decode-heavy, output tok/s |" in proc.stdout  # the printed table
    report = json.loads(out.read_text())
    assert report["smoke"] and report["versions"]["torch"] and _positive(report["copy_bandwidth_gb_s"])
    sections = report["sections"]
    for name in SECTIONS:
        assert "error" not in sections[name], (name, sections[name].get("traceback"))

    assert sections["nano_vllm_offline"]["num_requests"] == 6
    for name in ("hf_generate", "nano_vllm_offline", "decode_heavy", "prefill_heavy"):
        result = sections[name]
        assert _positive(result["output_tok_s"]) and _positive(result["input_tok_s"])
        # Rates are the token counts over the run's duration; latencies are ordered.
        assert result["output_tok_s"] == pytest.approx(result["output_tokens"] / result["duration_s"])
        assert result["input_tok_s"] == pytest.approx(result["input_tokens"] / result["duration_s"])
        if result.get("ttft_ms") and result.get("e2el_ms"):
            assert result["ttft_ms"]["mean"] <= result["e2el_ms"]["mean"]
            for key in ("ttft_ms", "e2el_ms"):
                assert result[key]["p50"] <= result[key]["p90"] <= result[key]["p99"]
    assert sections["decode_heavy"]["output_tokens"] == sections["hf_generate"]["output_tokens"] == 4 * 16
    assert _positive(sections["hf_generate"]["ours_over_hf"])
    assert sections["hf_generate"]["ours_over_hf"] == pytest.approx(
        sections["decode_heavy"]["output_tok_s"] / sections["hf_generate"]["output_tok_s"])

    steps = sections["step_time"]
    assert set(k for k in steps if k.startswith("batch_")) == {"batch_1", "batch_4"}
    for label, batch in (("batch_1", 1), ("batch_4", 4)):
        assert steps[label]["batch"] == batch and steps[label]["num_steady_steps"] >= 10
        assert all(_positive(steps[label][k]) for k in ("median_step_ms", "floor_ms", "ratio"))
        assert steps[label]["ratio"] == pytest.approx(steps[label]["median_step_ms"] / steps[label]["floor_ms"])

    overlap = sections["overlap"]
    assert overlap["outputs_identical"] and overlap["num_compared"] == 4
    for mode in ("on", "off"):
        assert _positive(overlap[mode]["wall_ms_per_step"]) and _positive(overlap[mode]["output_tok_s"])
        assert _positive(overlap[mode]["host_ms_per_step"])
        assert overlap[mode]["host_ms_per_step"] <= overlap[mode]["wall_ms_per_step"]  # host time is part of the wall
    assert _positive(sections["cuda_graphs"]["speedup"])
    assert _positive(sections["attention_backends"]["torch"]["output_tok_s"])
    profiled = sections["prefill_profile"]  # the smoke size's prompts fit one step
    assert profiled["num_requests"] == 4 and profiled["prompt_len"] == 64 and profiled["steps"] >= 1
    assert _positive(profiled["step_us_median"]) and profiled["ops"][0]["us_per_step"] > 0
    assert "kernels" not in profiled  # device kernels only on CUDA
    # whole prompts, not cache hits: a matmul among the costliest ops (their order moves on a busy machine)
    assert {"aten::mm", "aten::addmm", "aten::linear"} & {op["op"] for op in profiled["ops"][:3]}

    assert [row["figure"] for row in report["bars"]][:3] == [
        "nano-vllm offline, output tok/s", "decode-heavy, output tok/s", "prefill-heavy, input tok/s"]
    assert all(row["met"] is None for row in report["bars"])  # smoke: no verdict
    device_only = {"kernel launches per decode-graph replay"}  # kernels are counted on CUDA only
    assert all(_positive(row["value"]) for row in report["bars"] if row["figure"] not in device_only)

    fused = sections["fused_ab"]  # the CPU has no Triton forms: both engines run the same, identical tokens
    assert fused["greedy_match"] is True and fused["num_identical"] == fused["num_compared"] == 3
    assert _positive(fused["decode_heavy"]["on_over_off"])
    assert _positive(sections["decode_graph"]["batch_1"]["eager_step_ms"])
    assert sections["attention_kernels"]["skipped"]
    assert _positive(sections["decode_heavy"]["extra"]["host_ms_per_step"])
    figures = {"nano-vllm offline, output tok/s": sections["nano_vllm_offline"]["output_tok_s"],
               "decode-heavy, output tok/s": sections["decode_heavy"]["output_tok_s"],
               "prefill-heavy, input tok/s": sections["prefill_heavy"]["input_tok_s"]}
    for row in report["bars"][:3]:
        assert row["value"] == pytest.approx(figures[row["figure"]])  # the table shows the measured figure


def test_placeholder_tokenizer_serves_token_id_prompts(tmp_path: Path) -> None:
    """Without the default model's package the bench still starts: prompts are ids, nothing is detokenized."""
    from folovllm.bench.gpu_runs import SMOKE_CONFIG, save_placeholder_tokenizer

    (tmp_path / "config.json").write_text(json.dumps(SMOKE_CONFIG))
    save_placeholder_tokenizer(tmp_path)

    from folovllm import LLM, SamplingParams

    llm = LLM(str(tmp_path), load_format="dummy", device="cpu", num_gpu_blocks_override=64, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, detokenize=False)
    out = llm.generate([{"prompt_token_ids": [3, 300, 511]}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 5 and out.text == ""


def test_time_limit_skips_the_sections_that_would_start_after_it(tmp_path: Path) -> None:
    out = tmp_path / "gpu-bench.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_bench.py", "--smoke", "--time-limit", "0.001",
                           "--output-json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sections = json.loads(out.read_text())["sections"]
    assert {name: sections[name].get("skipped") for name in SECTIONS} == dict.fromkeys(SECTIONS, "time limit")
