"""Renders docs/vllm-compatibility.md: each of vLLM's public names (scripts/vllm_names.json) against the code.

    .venv/bin/python scripts/vllm_compat.py --write-docs   # rewrite the page
    .venv/bin/python scripts/vllm_compat.py                # print it

Nothing in the page is typed by hand: flags come from the `folovllm serve` and `bench serve` parsers
(an option whose help starts with "accepted for compatibility, has no effect" is one; a config field
with ``only`` metadata accepts one value), endpoints from the FastAPI app's routes, request fields from
the protocol's models and its tables of no-op and metadata fields, metrics from the server's
Prometheus registry, the offline API from the ``folovllm`` package, bench result keys from the
functions that write them. tests/test_vllm_compat_doc.py fails when the page is out of date.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

ROOT = Path(__file__).resolve().parent.parent
NAMES = ROOT / "scripts" / "vllm_names.json"
DOC = ROOT / "docs" / "vllm-compatibility.md"

YES, ALIAS, NO_EFFECT_STATUS, NO = "yes", "alias", "accepted, no effect", "no"


def _cell(text: str | None, limit: int = 110) -> str:
    text = " ".join((text or "").split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def _summary(rows: list[tuple[str, ...]]) -> str:
    counts = {status: sum(1 for row in rows if row[1] == status) for status in (YES, ALIAS, NO_EFFECT_STATUS, NO)}
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n)


# -- flags ------------------------------------------------------------------------------------------

def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _flag_rows(parser: argparse.ArgumentParser, names: list[str]) -> list[tuple[str, ...]]:
    from folovllm.config import NO_EFFECT, EngineConfig

    only = {f.name: f.metadata["only"] for f in dataclasses.fields(EngineConfig) if f.metadata.get("only")}
    by_option = {option: action for action in parser._actions for option in action.option_strings}
    rows = []
    for name in names:
        action = by_option.get(name)
        if action is None:
            rows.append((f"`{name}`", NO, "", ""))
            continue
        primary = action.option_strings[0]
        help_text = action.help or ""
        negation = isinstance(action, argparse.BooleanOptionalAction)
        if help_text.startswith(NO_EFFECT):
            status, note = NO_EFFECT_STATUS, help_text[len(NO_EFFECT):].lstrip(": ")
        elif primary != name and not negation:
            status, note = ALIAS, help_text
        else:
            status, note = YES, help_text
        if action.dest in only:
            allowed, feature = only[action.dest]
            note = f"only {allowed!r}: {feature} is not implemented yet (other values are an error)"
        ours = ", ".join(f"`{o}`" for o in action.option_strings)
        rows.append((f"`{name}`", status, ours, note))
    return rows


# -- endpoints, request fields, metrics -------------------------------------------------------------

class _StubCore:
    def __init__(self) -> None:
        from folovllm.engine.core_loop import EngineInfo

        # a cache config and weights, as a real engine reports: the server registers their series only then
        self.info = EngineInfo("stub", 16, cache_config={"block_size": "16"}, weight_bytes=1)


@functools.cache
def _app() -> FastAPI:
    """The server's app over a stub engine, with the server's default settings (metrics prefix included)."""
    from folovllm.entrypoints.openai.api_server import build_app
    from folovllm.entrypoints.openai.server_args import ServerConfig
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.tokenizer import load_tokenizer

    # the default model's tokenizer: the app reads its vocabulary (structured outputs) when built
    return build_app(_StubCore(), load_tokenizer(default_model_path()), ServerConfig(model_names=["stub"]))


def _routes() -> set[str]:
    """``METHOD /path`` of every API route the app has (included routers too), listed in its /openapi.json
    or not (that lists only those its engine serves: a generating one's or a pooling one's)."""
    from fastapi.routing import APIRoute

    from folovllm.entrypoints.openai.errors import app_routes

    api_routes = [route for route in app_routes(_app())
                  if isinstance(getattr(route, "original_route", route), APIRoute)]
    return {f"{method} {route.path}" for route in api_routes for method in route.methods}


def served_metrics() -> set[str]:
    """The metric families the server's /metrics registry holds (counters without ``_total``)."""
    return {family.name for family in _app().state.metrics.registry.collect()}


def _endpoint_rows(names: list[str]) -> list[tuple[str, ...]]:
    routes = _routes()
    rows = [(f"`{name}`", YES if name in routes else NO) for name in names]
    vllm = set(names)
    return rows + [(f"`{route}`", "FoloVLLM only") for route in sorted(routes - vllm)]


def _request_field_rows(names: list[str], model) -> list[tuple[str, ...]]:
    from folovllm.entrypoints.openai import protocol

    noop = {**getattr(protocol, "_NOOP", {}), **getattr(model, "_extra_noop", {})}
    metadata = set(getattr(protocol, "_METADATA", set())) | set(getattr(model, "_extra_metadata", ()))
    rows = []
    for name in names:
        if name in model.model_fields:
            rows.append((f"`{name}`", YES, ""))
        elif name in metadata:
            rows.append((f"`{name}`", NO_EFFECT_STATUS, "describes the request only"))
        elif name in noop:
            rows.append((f"`{name}`", NO, "accepted only with its no-op value; otherwise a 400 that names it"))
        else:
            rows.append((f"`{name}`", NO, "ignored, with a log line"))
    return rows


def _metric_rows(names: list[str]) -> list[tuple[str, ...]]:
    served = served_metrics()
    return [(f"`{name}`", YES, f"`{name}`") if name in served else (f"`{name}`", NO, "") for name in names]


# -- offline API, sampling params, bench result keys -------------------------------------------------

def _has(dotted: str) -> bool:
    if dotted.startswith("LLM."):
        from folovllm.entrypoints.llm import LLM

        attribute = dotted.split(".", 1)[1]
        return hasattr(LLM, attribute) or f"self.{attribute} =" in inspect.getsource(LLM.__init__)
    module_name, _, attribute = ("folovllm" + dotted[len("vllm"):]).rpartition(".")
    try:
        return hasattr(importlib.import_module(module_name), attribute)
    except ImportError:
        return False


def _offline_rows(names: list[str]) -> list[tuple[str, ...]]:
    return [(f"`{name}`", YES if _has(name) else NO) for name in names]


def _sampling_rows(names: list[str]) -> list[tuple[str, ...]]:
    from folovllm.sampling_params import SamplingParams

    ours = {f.name for f in dataclasses.fields(SamplingParams)}
    return [(f"`{name}`", YES if name in ours else NO) for name in names]


def _bench_key_rows(names: list[str]) -> list[tuple[str, ...]]:
    from folovllm.bench.datasets import ServeRequest
    from folovllm.bench.serve_client import RequestOutcome
    from folovllm.bench.serve_results import (
        build_serve_result,
        vllm_result_fields,
        vllm_run_fields,
    )

    outcomes = [RequestOutcome(ServeRequest([1], 2, 1), 0.0, 1.0, [0.5, 1.0], 1, 2)]
    result = build_serve_result(outcomes, name="stub", engine="stub", model="stub", config={},
                                slos={"ttft": 1000.0})
    keys = set(result)
    keys |= set(vllm_run_fields(backend=None, label=None, model="stub", tokenizer=None, num_prompts=1,
                                rate=None, burstiness=1.0, max_concurrency=None))
    keys |= set(vllm_result_fields(outcomes, result, ["ttft", "tpot", "itl"], [99.0]))
    return [(f"`{name}`", YES if name in keys else NO) for name in names]


# -- the page ------------------------------------------------------------------------------------

def render_docs() -> str:
    """The whole page, from the code and scripts/vllm_names.json."""
    from folovllm.entrypoints.cli import build_parser
    from folovllm.entrypoints.openai.protocol import CompletionRequest
    from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
    from folovllm.entrypoints.openai.protocol_messages import MessagesRequest
    from folovllm.entrypoints.openai.protocol_responses import ResponsesRequest

    names = json.loads(NAMES.read_text())
    parser = build_parser()
    serve, bench_serve = _subparser(parser, "serve"), _subparser(parser, "bench", "serve")
    out = ["# FoloVLLM as a drop-in for vLLM", "",
           "Generated by `.venv/bin/python scripts/vllm_compat.py --write-docs` from the code and the list of "
           "vLLM's names in `scripts/vllm_names.json`; do not edit by hand (`tests/test_vllm_compat_doc.py` "
           "fails when it is out of date).", "",
           "Statuses: **yes** — implemented with vLLM's meaning; **alias** — another spelling of one of our "
           "options; **accepted, no effect** — taken, with a one-line warning, where it cannot change anything "
           "here; **no** — not available (a flag is an argparse error, a request field a 400 or a logged "
           "no-op). A setting whose absence would change results is an error that names the missing feature.",
           "", "`folovllm serve MODEL` takes the model positionally or as `--model`: a `.gguf` file, an HF folder, "
           "or a Hugging Face hub id (the local cache first, then a download unless `HF_HUB_OFFLINE` is set). "
           "Every engine flag is also an `LLM(...)` keyword (underscores for dashes).", ""]
    all_flags = [(group, _flag_rows(serve, flags)) for group, flags in names["serve_flags"].items()]
    flat = [row for _, rows in all_flags for row in rows]
    out += [f"## `vllm serve` flags ({_summary(flat)})", ""]
    for group, rows in all_flags:
        out += [f"### {group}", ""] + _table(("vLLM", "status", "FoloVLLM", "notes"), rows) + [""]
    sections = [
        ("`vllm bench serve` flags", ("vLLM", "status", "FoloVLLM", "notes"),
         _flag_rows(bench_serve, names["bench_serve_flags"])),
        ("`vllm bench serve --save-result` keys", ("vLLM", "status"), _bench_key_rows(names["bench_result_keys"])),
        ("Endpoints", ("vLLM", "status"), _endpoint_rows(names["endpoints"])),
        ("`/v1/completions` request fields", ("vLLM", "status", "notes"),
         _request_field_rows(names["request_fields"]["completions"], CompletionRequest)),
        ("`/v1/chat/completions` request fields", ("vLLM", "status", "notes"),
         _request_field_rows(names["request_fields"]["chat"], ChatCompletionRequest)),
        ("`/v1/responses` request fields (OpenAI's names)", ("vLLM", "status", "notes"),
         _request_field_rows(names["request_fields"]["responses"], ResponsesRequest)),
        ("`/v1/messages` request fields (Anthropic's names)", ("vLLM", "status", "notes"),
         _request_field_rows(names["request_fields"]["messages"], MessagesRequest)),
        ("Prometheus metrics (`/metrics`)", ("vLLM", "status", "FoloVLLM"), _metric_rows(names["metrics"])),
        ("Offline API", ("vLLM", "status"), _offline_rows(names["offline_api"])),
        ("`SamplingParams` fields", ("vLLM", "status"), _sampling_rows(names["sampling_params"])),
    ]
    for title, header, rows in sections:
        counted = [row for row in rows if row[1] != "FoloVLLM only"]
        out += [f"## {title} ({_summary(counted)})", ""] + _table(header, rows) + [""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help=f"write {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    page = render_docs()
    if args.write_docs:
        DOC.write_text(page)
        print(f"wrote {DOC.relative_to(ROOT)}")
    else:
        print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
