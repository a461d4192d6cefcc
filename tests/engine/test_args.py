"""The engine's CLI flags come from EngineConfig's fields: same names and defaults as the config."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from folovllm.config import EngineConfig
from folovllm.engine.args import add_engine_args, engine_config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_the_config_defaults() -> None:
    assert engine_config_from_args(parse()) == EngineConfig()
    cli_fields = {f.name for f in dataclasses.fields(EngineConfig) if f.metadata["cli"]}
    assert cli_fields <= set(vars(parse()))
    assert "tenant_weights" not in vars(parse()) and "num_gpu_blocks_override" not in vars(parse())


def test_flag_names_types_and_switches() -> None:
    config = engine_config_from_args(parse(
        "--max-model-len", "64", "--gpu-memory-utilization", "0.5", "--kv-cache-memory", "1GiB",
        "--no-prefix-caching", "--no-chunked-prefill", "--no-overlap", "--enforce-eager",
        "--trace", "steps.jsonl", "--scheduling-policy", "sjf", "--admission", "reserve",
        "--attention-backend", "torch"))
    assert (config.max_model_len, config.gpu_memory_utilization, config.kv_cache_memory) == (64, 0.5, 2**30)
    assert not config.enable_prefix_caching and not config.enable_chunked_prefill
    assert config.overlap_scheduling is False and config.enforce_eager
    assert (config.trace_path, config.scheduling_policy, config.admission, config.attention_backend) == (
        "steps.jsonl", "sjf", "reserve", "torch")


def test_registered_names_are_the_choices() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    choices = {a.dest: a.choices for a in parser._actions if a.choices}
    assert choices["attention_backend"] == ["auto", "cpu", "torch", "triton"]
    assert choices["scheduling_policy"] == ["fcfs", "priority", "sjf", "fair"]
    assert choices["admission"] == ["on-demand", "reserve", "adaptive"]
    assert choices["dtype"] == ["auto", "float32", "bfloat16", "float16"]


def test_the_platform_switches_are_environment_variables_not_flags(capsys) -> None:
    from folovllm.entrypoints.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help-env"])
    assert exit_info.value.code == 0
    table = capsys.readouterr().out
    assert "`FOLOVLLM_CPU_ISA`" in table and "`FOLOVLLM_CPU_LINEAR`" in table
    with pytest.raises(SystemExit):
        parse("--no-cpu-prepack")


def test_vllm_spellings_of_our_switches() -> None:
    assert not engine_config_from_args(parse("--no-enable-prefix-caching")).enable_prefix_caching
    assert engine_config_from_args(parse("--enable-prefix-caching")).enable_prefix_caching
    assert not engine_config_from_args(parse("--no-enable-chunked-prefill")).enable_chunked_prefill
    assert engine_config_from_args(parse("--enable-chunked-prefill")).enable_chunked_prefill
    config = engine_config_from_args(parse("-tp", "1", "--data-parallel-size", "1", "--dtype", "half",
                                           "-q", "int8", "--hf-overrides", '{"rope_theta": 5.0}',
                                           "--max-logprobs", "5", "--generation-config", "vllm",
                                           "--tokenizer", "tok", "--seed", "3"))
    assert (config.tensor_parallel_size, config.data_parallel_size, config.dtype, config.quantization) == (
        1, 1, "float16", "int8")
    assert config.hf_overrides == {"rope_theta": 5.0} and config.max_logprobs == 5
    assert (config.generation_config, config.tokenizer, config.seed) == ("vllm", "tok", 3)
    assert engine_config_from_args(parse("-tp", "2")).tensor_parallel_size == 2


@pytest.mark.parametrize("argv, missing", [
    (("--kv-cache-dtype", "fp8", "--calculate-kv-scales"), "calculate_kv_scales"),
    (("--data-parallel-size", "0"), "data_parallel_size must be >= 1"),
])
def test_settings_that_would_change_results_are_errors(argv, missing) -> None:
    with pytest.raises(ValueError, match=missing):
        engine_config_from_args(parse(*argv))


def test_data_parallel_flags_parse() -> None:
    config = engine_config_from_args(parse("-dp", "2", "--num-threads", "5"))
    assert (config.data_parallel_size, config.dp_routing, config.threads_per_replica) == (2, "prefix_aware", 2)
    assert engine_config_from_args(parse("--dp-routing", "round_robin")).dp_routing == "round_robin"
    with pytest.raises(SystemExit):
        parse("--dp-routing", "random")


def test_settings_that_cannot_matter_warn_in_one_line_each() -> None:
    assert EngineConfig().ignored_settings() == []
    config = engine_config_from_args(parse("--trust-remote-code", "--swap-space", "4", "--cpu-offload-gb", "1",
                                           "--disable-log-stats", "--enforce-eager", "--device", "cpu",
                                           "--gpu-memory-utilization", "0.5"))
    lines = config.ignored_settings()
    assert len(lines) == 6 and all(line.startswith("accepted for compatibility, has no effect: ") for line in lines)
    assert any("--trust-remote-code" in line for line in lines)
    assert any("--enforce-eager" in line for line in lines)


def test_settings_resolve_derives_are_not_warned_about() -> None:
    given = EngineConfig(device="cpu", tensor_parallel_size=2)
    resolved = given.resolve()
    assert resolved.enforce_eager  # tensor parallelism turns CUDA graphs off itself
    assert given.ignored_settings(resolved.device) == []  # the user never asked for eager mode


def test_serve_help_groups_flags_as_vllm_does() -> None:
    from folovllm.entrypoints.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    groups = {g.title: {a.dest for a in g._group_actions} for g in serve._action_groups}
    assert {"model", "tokenizer", "dtype", "max_logprobs", "generation_config"} <= groups["ModelConfig"]
    assert {"block_size", "enable_prefix_caching", "kv_cache_dtype", "swap_space"} <= groups["CacheConfig"]
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"} <= groups["SchedulerConfig"]
    assert {"tensor_parallel_size", "data_parallel_size"} <= groups["ParallelConfig"]
    assert {"host", "port"} <= groups["Frontend"]


def test_model_is_positional_too() -> None:
    from folovllm.entrypoints.cli import build_parser

    for argv in (["serve", "org/name"], ["generate", "org/name"], ["bench", "throughput", "org/name"]):
        args = build_parser().parse_args(argv)
        assert engine_config_from_args(args).model == "org/name"
    assert engine_config_from_args(build_parser().parse_args(["serve", "--model", "org/name"])).model == "org/name"
    with pytest.raises(ValueError, match="given twice"):
        engine_config_from_args(build_parser().parse_args(["serve", "org/a", "--model", "org/b"]))
