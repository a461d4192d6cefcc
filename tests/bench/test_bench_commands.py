"""``folovllm bench switch``, ``kernel`` and ``profile`` on a tiny model: they run, report what they say, and
refuse what they cannot run."""
from __future__ import annotations

import json

import pytest

from folovllm.bench.switch import parse_switch
from folovllm.entrypoints.cli import build_parser, main
from tests.engine.conftest import tiny_llama_dir  # noqa: F401 (a fixture)


def test_a_switch_names_a_variable_or_an_engine_setting() -> None:
    switch = parse_switch("FOLOVLLM_CPU_FUSED_OPS=on,off")
    assert switch.is_variable and switch.values == ("on", "off")
    assert not parse_switch("attention_backend=cpu,torch").is_variable
    with pytest.raises(SystemExit, match="neither a FOLOVLLM_"):
        parse_switch("FOLOVLLM_NOPE=a,b")
    with pytest.raises(SystemExit, match="two values"):
        parse_switch("dtype=float32")
    with pytest.raises(SystemExit, match="takes on, off"):
        parse_switch("FOLOVLLM_CPU_FUSED_OPS=on,maybe")


def test_switch_runs_both_engines_and_compares_tokens(tiny_llama_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "switch.json"
    main(["bench", "switch", "FOLOVLLM_CPU_FUSED_OPS=on,off", tiny_llama_dir, "--workloads", "one-stream",
          "--rounds", "1", "--threads", "1", "--dtype", "float32", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["switch"] == "FOLOVLLM_CPU_FUSED_OPS" and results["platform"]["platform"] == "cpu"
    assert results["workloads"]["one-stream"]["same_greedy_tokens"]


def test_kernel_times_each_candidate_at_the_model_shapes(tiny_llama_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "kernel.json"
    main(["bench", "kernel", "linear", "--model", tiny_llama_dir, "--rows", "1,64", "--rounds", "1",
          "--threads", "1", "--dtype", "float32", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["shape"] for r in rows} == {"qkv", "o_proj", "gate_up", "down", "lm_head"}
    assert "torch" in {r["candidate"] for r in rows} and all(r["us"] > 0 for r in rows)
    assert all((r["gemm_limit_share"] is None) == (r["rows"] < 64) for r in rows)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "kernel", "softmax"])


def test_kernel_gguf_times_each_type_against_the_memory_bandwidth(tiny_llama_dir, tmp_path,  # noqa: F811
                                                                   capsys) -> None:
    from tests.tiers import kernel_missing

    if kernel_missing("gguf"):
        pytest.skip(kernel_missing("gguf"))
    out = tmp_path / "gguf.json"
    main(["bench", "kernel", "gguf", "--model", tiny_llama_dir, "--types", "Q4_K,Q8_0", "--shapes", "64x256,32x512",
          "--rows", "1,3", "--rounds", "1", "--threads", "1", "--copies", "2", "--bandwidth-mib", "8",
          "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["memory_bandwidth"]["triad_gb_s"] > 0 and results["memory_bandwidth"]["array_mib"] == 8
    rows = results["rows"]
    assert {r["shape"] for r in rows} == {"64x256", "32x512"} and {"Q4_K", "Q8_0"} <= {r["candidate"] for r in rows}
    q8 = next(r for r in rows if r["candidate"] == "Q8_0" and r["shape"] == "64x256")
    assert q8["weight_bytes"] == 64 * 256 // 32 * 34 and q8["copies"] == 2 and q8["triad_share"] > 0
    assert main(["bench", "kernel", "gguf", "--model", tiny_llama_dir, "--types", "Q3_K"]) == 2
    assert "unknown GGUF type 'Q3_K'" in capsys.readouterr().err


def test_kernel_attention_times_decode_and_fresh_prompt_steps(tiny_llama_dir, tmp_path) -> None:  # noqa: F811
    for extra, prompt_len in (([], 0), (["--scattered"], 0), (["--prompt-len", "20"], 20)):
        out = tmp_path / "attention.json"
        main(["bench", "kernel", "attention", "--model", tiny_llama_dir, "--rows", "2", "--context", "17",
              "--rounds", "1", "--threads", "1", "--dtype", "float32", "--out", str(out), *extra])
        rows = json.loads(out.read_text())["rows"]
        assert "torch" in {r["candidate"] for r in rows}
        assert all(r["us_per_step"] > 0 and r["gflop_s"] > 0 and r["prompt_len"] == prompt_len for r in rows)


def test_kernel_sampling_times_the_platforms_kernel_beside_the_torch_form(tiny_llama_dir, tmp_path) -> None:  # noqa: F811
    from folovllm.platforms import platform_for

    out = tmp_path / "sampling.json"
    main(["bench", "kernel", "sampling", "--model", tiny_llama_dir, "--rows", "1,5", "--vocab", "100,6000",
          "--rounds", "1", "--threads", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    expected = {"torch"} | ({"folovllm"} if platform_for("cpu").candidate_sampler() else set())
    assert {r["candidate"] for r in rows} == expected and {r["vocab"] for r in rows} == {100, 6000}
    assert all(r["us_per_step"] > 0 for r in rows) and {r["batch"] for r in rows} == {1, 5}


def test_a_prefill_steps_inputs_give_each_backend_the_same_attention() -> None:
    import torch

    from folovllm.attention.backend import get_attention_backend
    from folovllm.bench.kernels import step_inputs
    from folovllm.platforms import platform_for

    torch.manual_seed(0)
    meta, q, k, v = step_inputs(3, 0, 21, 16, (4, 2, 16), torch.float32)
    assert q.shape == (63, 4, 16) and meta.slot_mapping.unique().numel() == 63 and meta.query_lens == [21] * 3
    names = ["torch"] + (["cpu"] if platform_for("cpu").auto_attention_backend() == "cpu" else [])
    outs = []
    for name in names:
        cache = [torch.zeros(3 * 2, 16, 2, 16) for _ in range(2)]
        outs.append(get_attention_backend(name).forward(q, k, v, *cache, meta, 0.25))
    reference = torch.nn.functional.scaled_dot_product_attention(  # the first prompt, by hand
        q[:21].transpose(0, 1), k[:21].repeat_interleave(2, 1).transpose(0, 1),
        v[:21].repeat_interleave(2, 1).transpose(0, 1), is_causal=True, scale=0.25).transpose(0, 1)
    for out in outs:
        torch.testing.assert_close(out.view(63, 4, 16)[:21], reference, rtol=1e-5, atol=1e-5)


def test_scattered_decode_inputs_put_the_blocks_in_random_places_and_attend_alike() -> None:
    import torch

    from folovllm.attention.backend import get_attention_backend
    from folovllm.bench.kernels import step_inputs
    from folovllm.platforms import platform_for

    torch.manual_seed(0)
    meta, q, k, v = step_inputs(4, 40, 0, 16, (4, 2, 16), torch.float32, scattered=True)
    tables = meta.block_tables
    assert sorted(tables.flatten().tolist()) == list(range(4 * 3))  # every block once, 3 per sequence
    assert not torch.equal(tables.flatten(), torch.arange(4 * 3))
    names = ["torch"] + (["cpu"] if platform_for("cpu").auto_attention_backend() == "cpu" else [])
    caches = [torch.randn(4 * 3, 16, 2, 16) for _ in range(2)]
    outs = [get_attention_backend(name).forward(q, k, v, *[c.clone() for c in caches], meta, 0.25) for name in names]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)


def test_profile_splits_steps_into_ops_and_host_time(tiny_llama_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "profile.json"
    main(["bench", "profile", tiny_llama_dir, "--batch", "2", "--steps", "3", "--dtype", "float32",
          "--bandwidth-mib", "8", "--bandwidth-rounds", "2", "--round-steps", "2", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["steps"] == 3 and results["step_us_median"] > 0 and results["ops"]
    assert results["host_us_per_step"] >= 0
    read = results["weights_read"]  # every linear's weights, the head's included, against the host's bandwidth
    assert read["bytes_per_step"] > 0 and read["gb_s"] > 0 and read["memory_bandwidth"]["triad_gb_s"] > 0
    # rounds of a triad and then timed steps: each step time set against the triad of its moment
    assert len(read["rounds"]) == 2
    for r in read["rounds"]:
        assert r["triad_share"] == pytest.approx(read["bytes_per_step"] / r["step_us_median"] / 1e3 / r["triad_gb_s"])
    assert min(r["triad_share"] for r in read["rounds"]) <= read["round_share_median"] <= \
        max(r["triad_share"] for r in read["rounds"])
