"""The engine's CLI flags come from EngineConfig's fields: same names and defaults as the config."""
from __future__ import annotations

import argparse
import dataclasses

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


def test_cpu_prepack_is_on_unless_switched_off() -> None:
    assert engine_config_from_args(parse()).cpu_prepack
    assert not engine_config_from_args(parse("--no-cpu-prepack")).cpu_prepack
