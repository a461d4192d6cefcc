"""``folovllm bench switch``: one setting's two values, end to end, on the alternating-rounds harness.

    folovllm bench switch FOLOVLLM_CPU_FUSED_OPS=on,off --workloads one-stream,decode-batch
    folovllm bench switch attention_backend=cpu,torch --dtype float32
    FOLOVLLM_CPU_ISA=avx2 folovllm bench switch dtype=bfloat16,float32

The setting is a ``FOLOVLLM_*`` variable (set while its engine is built: the platform reads them then) or
an engine setting (an ``EngineConfig`` field, as ``--dtype`` and the other flags name them). Both engines
load in one process; each round times every workload on both, alternating which goes first
(``switch_ab.compare_switch``); the result holds each side's median, their ratio and whether the greedy
tokens agree (a switch that changes them is a bug, not a speed-up).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from folovllm import envs
from folovllm.bench.switch_ab import (
    SwitchWorkload,
    add_switch_args,
    chosen_workloads,
    compare_switch,
    write_switch_results,
)
from folovllm.config import EngineConfig
from folovllm.engine.args import add_engine_args, add_model_positional, engine_config_from_args

# requests, prompt tokens, shortest and longest output; what each scores
WORKLOADS = {
    "one-stream": SwitchWorkload(1, 16, 128, 128, "ms_per_output_token"),
    "decode-batch": SwitchWorkload(64, 16, 64, 64),
    "variable": SwitchWorkload(32, 24, 32, 128),
    "prefill": SwitchWorkload(8, 512, 1, 1, "input_tok_s"),
}
DEFAULT_WORKLOADS = ["one-stream", "decode-batch", "prefill"]


@dataclasses.dataclass(frozen=True)
class Switch:
    """``name`` (a FOLOVLLM_* variable or an EngineConfig field) at ``values[0]`` (on) and ``values[1]`` (off)."""

    name: str
    values: tuple[str, str]

    @property
    def is_variable(self) -> bool:
        return self.name in envs.VARIABLES


def switch_from_text(text: str) -> Switch:
    """``NAME=A,B`` -> Switch; ValueError naming what is wrong."""
    name, _, values = text.partition("=")
    sides = tuple(v for v in values.split(",") if v)
    if not name or len(sides) != 2:
        raise ValueError(f"a switch is NAME=A,B (two values), got {text!r}")
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    if name not in envs.VARIABLES and name not in fields:
        raise ValueError(f"{name!r} is neither a FOLOVLLM_* variable (`folovllm --help-env`) nor an engine "
                         "setting (an EngineConfig field, e.g. attention_backend, dtype)")
    switch = Switch(name, sides)  # type: ignore[arg-type]
    if switch.is_variable and envs.VARIABLES[name].choices:
        bad = [v for v in sides if v not in envs.VARIABLES[name].choices]
        if bad:
            raise ValueError(f"{name} takes {', '.join(envs.VARIABLES[name].choices)}; got {bad}")
    return switch


def parse_switch(text: str) -> Switch:
    """``switch_from_text`` for the command line: SystemExit naming what is wrong."""
    try:
        return switch_from_text(text)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def add_bench_switch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("switch", help="NAME=A,B: a FOLOVLLM_* variable or an engine setting, and its two values")
    add_switch_args(parser, WORKLOADS, DEFAULT_WORKLOADS)
    add_model_positional(parser)
    add_engine_args(parser)


def build_engine(config: EngineConfig, switch: Switch, value: str) -> Any:
    """An LLM with the switch at ``value`` (the variable set while the engine is built)."""
    from folovllm import LLM  # the engine, only once a run is asked for

    if not switch.is_variable:
        field = next(f for f in dataclasses.fields(EngineConfig) if f.name == switch.name)
        kind = type(field.default) if field.default is not None else str
        typed: Any = value if kind is str else (value in ("on", "true", "1") if kind is bool else kind(value))
        return LLM(**{**vars(config), switch.name: typed})
    with envs.overridden({switch.name: value}):
        return LLM(**vars(config))


def run_bench_switch(args: argparse.Namespace) -> dict[str, Any]:
    switch = parse_switch(args.switch)
    names = chosen_workloads(args.workloads, WORKLOADS)
    config = dataclasses.replace(engine_config_from_args(args), num_threads=args.threads)
    engines = {on: build_engine(config, switch, switch.values[0 if on else 1]) for on in (True, False)}
    print(f"{switch.name}: on = {switch.values[0]}, off = {switch.values[1]}; "
          f"platform: {engines[True].llm_engine.platform_info}")
    results = compare_switch(engines, WORKLOADS, names, args.rounds, args.threads,
                             engines[True].llm_engine.vocab_size)
    results.update(switch=switch.name, on=switch.values[0], off=switch.values[1],
                   platform=engines[True].llm_engine.platform_info)
    write_switch_results(results, args.out)
    return results
