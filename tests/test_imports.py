"""The package's imports run one way: CLI -> bench/server/simulator -> engine -> core/worker ->
compilation -> model/attention/sample -> platforms -> envs, engine/server -> structured_output,
CLI -> quantize -> model, and CLI -> proxy; the config asks the platforms (its own cross-knob checks and the
speculative config's) only; the small shared modules
depend on nothing in the package."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "folovllm"

# What each part may not import (by dotted prefix); a part is a module or a subpackage.
FORBIDDEN = {
    "config": ["folovllm"],
    # the config's checks that span several knobs: they see the config (its type) and nothing else
    "config_checks": ["folovllm"],
    # resolving the config's autos: it sees the config (its type) and asks the device's platform
    "config_resolve": ["folovllm"],
    "envs": ["folovllm"],
    # what each device decides, the CPU's tiers and its kernel library: below every part that asks
    "platforms": ["folovllm"],
    # a loaded model's faster forms: the worker builds them; they know the model, never the engine
    "compilation": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                    "folovllm.worker", "folovllm.quantize", "folovllm.structured_output"],
    "registry": ["folovllm"],
    "paging": ["folovllm"],
    "inputs": ["folovllm"],
    # beam search's data and step: plain values over outputs.Logprob; LLM runs it on the engine
    "beam_search": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                    "folovllm.worker", "folovllm.model", "folovllm.quantize"],
    "bench": ["folovllm.entrypoints", "folovllm.simulator"],
    "engine": ["folovllm.entrypoints", "folovllm.bench", "folovllm.quantize", "folovllm.simulator"],
    "core": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.quantize",
             "folovllm.structured_output", "folovllm.simulator"],
    "worker": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.quantize",
               "folovllm.structured_output"],
    "model": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
              "folovllm.worker", "folovllm.quantize", "folovllm.structured_output", "folovllm.compilation"],
    "attention": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                  "folovllm.worker", "folovllm.model", "folovllm.quantize", "folovllm.structured_output"],
    "sample": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
               "folovllm.worker", "folovllm.model", "folovllm.quantize", "folovllm.structured_output"],
    # pooling: the worker pools hidden states, the engine and server pair and score; it knows none of them
    "pooling": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                "folovllm.worker", "folovllm.model", "folovllm.quantize", "folovllm.structured_output"],
    "pooling_params": ["folovllm"],
    # process groups, collectives, rank processes: model layers call it; it knows no layer, worker or engine
    "distributed": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                    "folovllm.worker", "folovllm.model", "folovllm.attention", "folovllm.sample",
                    "folovllm.quantize", "folovllm.structured_output"],
    # grammars for constrained decoding: used by the engine (and the server, to check a constraint
    # early); takes the tokenizer it is given, so it reads no model, scheduler or worker
    "structured_output": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                          "folovllm.worker", "folovllm.model", "folovllm.attention", "folovllm.sample",
                          "folovllm.quantize", "folovllm.distributed"],
    # the prefill/decode proxy: relays HTTP between servers, so it reads nothing of the engine or server
    "proxy": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
              "folovllm.worker", "folovllm.model", "folovllm.attention", "folovllm.sample",
              "folovllm.quantize", "folovllm.structured_output", "folovllm.distributed"],
    # the simulator: the real scheduler and KV cache on a virtual clock, fed by bench serve's request and
    # arrival generators; run by the CLI; never the engine, worker or model (no forward is run)
    "simulator": ["folovllm.entrypoints", "folovllm.engine", "folovllm.worker", "folovllm.model",
                  "folovllm.attention", "folovllm.sample", "folovllm.structured_output", "folovllm.quantize",
                  "folovllm.distributed", "folovllm.bench.serve", "folovllm.bench.driver",
                  "folovllm.bench.throughput", "folovllm.bench.policies", "folovllm.bench.prefix"],
    # KV transfer between instances (PD disaggregation): the scheduler and worker call it; it sees
    # requests, the config and KV tensors, never the engine, the server or the model
    "kv_transfer": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                    "folovllm.worker", "folovllm.model", "folovllm.attention", "folovllm.sample",
                    "folovllm.quantize", "folovllm.structured_output"],
    # LoRA adapters: requests (engine side), loading and the op over the model's linears (worker side)
    "lora": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core", "folovllm.worker",
             "folovllm.quantize", "folovllm.structured_output", "folovllm.compilation"],
    # speculative decoding's engine side: proposals (n-gram, a draft model's worker) and settling each step
    "spec_decode": ["folovllm.entrypoints", "folovllm.bench", "folovllm.quantize", "folovllm.simulator"],
    # vLLM's speculative_config dict, checked: the config asks it, so it depends on nothing
    "spec_decode/config": ["folovllm"],
    # the offline quantizer: run by the CLI, reads models through folovllm.model
    "quantize": ["folovllm.entrypoints", "folovllm.bench", "folovllm.engine", "folovllm.core",
                 "folovllm.worker"],
}
# Exceptions to FORBIDDEN: what a part may import even so.
ALLOWED = {"config": ["folovllm.platforms", "folovllm.envs", "folovllm.spec_decode.config", "folovllm.config_checks",
                      "folovllm.config_resolve"],
           "config_checks": ["folovllm.config"], "config_resolve": ["folovllm.config", "folovllm.platforms", "folovllm.envs"],
           "platforms": ["folovllm.platforms", "folovllm.envs"]}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "folovllm":  # ``from folovllm import envs`` imports folovllm.envs, named below
                names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def files_of(part: str) -> list[Path]:
    folder = PACKAGE / part
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{part}.py"]


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_imports_run_one_way(part: str) -> None:
    files = files_of(part)
    assert files and all(f.exists() for f in files), f"folovllm/{part} is gone: update FORBIDDEN"
    wrong = [f"{f.relative_to(PACKAGE.parent)} imports {name}"
             for f in files for name in sorted(imported_modules(f))
             for prefix in FORBIDDEN[part] if under(name, prefix)
             and not any(under(name, allowed) for allowed in ALLOWED.get(part, ()))]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from folovllm.entrypoints.args import x\n    import folovllm.bench\n")
    assert {"folovllm.entrypoints.args", "folovllm.bench"} <= imported_modules(source)
