"""``folovllm bench serve``: online load against any OpenAI-compatible server (ours, vLLM, SGLang, ...).

Requests arrive at a rate (burst, Poisson, or gamma-bursty), optionally capped in flight, each
streamed; the client's timestamps give TTFT, TPOT, ITL and E2E latency. ``--sweep-rates`` repeats the run at
several rates for a throughput-latency curve. The CLI couples to this module only through
``add_serve_args`` and ``run_serve``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from folovllm.bench import datasets as ds
from folovllm.bench.arrivals import arrival_offsets, parse_rates
from folovllm.bench.results import write_results
from folovllm.bench.serve_client import (
    ENDPOINT_PATHS,
    RequestOutcome,
    ServedModel,
    auth_headers,
    fetch_models,
    send_request,
)
from folovllm.bench.serve_results import (
    build_serve_result,
    format_serve_result,
    latency_samples_ms,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    vllm_result_fields,
    vllm_run_fields,
)
from folovllm.bench.serve_workload import add_workload_args, build_workload_requests
from folovllm.bench.structured import format_overhead, load_schema, overhead_summary, schema_body

REQUEST_TIMEOUT_S = 6 * 3600.0  # a request under heavy load may queue long: only a hung server times out
CHECK_MAX_TOKENS = 4

logger = logging.getLogger(__name__)


def _endpoint(text: str) -> str:
    """Our endpoint names, or vLLM's paths (``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``)."""
    return {path: name for name, path in ENDPOINT_PATHS.items()}.get(text, text)


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench serve`` options to ``parser`` and return it (``vllm bench serve``'s names too)."""
    g = parser.add_argument_group("server")
    g.add_argument("--base-url", default=None, help="the server, without /v1 (default: http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--endpoint", type=_endpoint, choices=list(ENDPOINT_PATHS), default=None,
                   help="completions (or /v1/completions) sends token-id prompts (exact lengths); "
                        "chat (or /v1/chat/completions) sends random words; embeddings (or /v1/embeddings) "
                        "sends token-id inputs to a pooling server (throughput in inputs/s and tokens/s)")
    g.add_argument("--backend", "--endpoint-type", choices=list(_BACKENDS), default=None,
                   help="vLLM's spelling of the endpoint: openai-chat = chat, vllm/openai = completions, "
                        "openai-embeddings (or embeddings) = embeddings")
    g.add_argument("--model", default=None, help="model name to request (default: first id of GET /v1/models)")
    g.add_argument("--tokenizer", default=None,
                   help="accepted for compatibility, has no effect: prompts are token ids or words, and "
                        "token counts come from the server's usage")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    a = add_workload_args(parser)
    a.add_argument("--sweep-rates", default=None, metavar="R1,R2,...",
                   help="run once per rate (inf allowed) for a throughput-latency curve")
    a.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    a.add_argument("--structured-json-schema", default=None, metavar="FILE|builtin",
                   help="every request generates under this JSON schema (response_format json_schema); "
                        "builtin: a small open-ended object schema")
    a.add_argument("--structured-rounds", type=int, default=None, metavar="N",
                   help="with --structured-json-schema: N alternating rounds without and with the schema, "
                        "then the ratio of median output tok/s")
    o = parser.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:200 tpot:50 e2el:5000")
    o.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="metrics whose percentiles the vLLM-format keys report (of ttft,tpot,itl,e2el)")
    o.add_argument("--metric-percentiles", default="99", help="those percentiles, e.g. 50,90,99")
    o.add_argument("--output-json", default=None, help="write the list of result objects here")
    o.add_argument("--save-result", action="store_true",
                   help="write each run's result object (vLLM's keys and ours) as a JSON file")
    o.add_argument("--result-dir", default=None, help="--save-result: the folder (default: here)")
    o.add_argument("--result-filename", default=None,
                   help="--save-result: the file name (default: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)")
    o.add_argument("--label", default=None, help="names the run in the saved file (default: folovllm)")
    o.add_argument("--plot", default=None, metavar="DIR", help="write latency CDFs (and the sweep curve) as PNGs")
    o.add_argument("--no-progress", "--disable-tqdm", dest="no_progress", action="store_true",
                   help="no progress bar")
    return parser


_BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat",
             "openai-embeddings": "embeddings", "embeddings": "embeddings"}


def endpoint_of(args: argparse.Namespace) -> str:
    """--endpoint, else what --backend names, else completions."""
    if args.endpoint is not None:
        return args.endpoint
    return _BACKENDS[args.backend] if args.backend else "completions"


def base_url_of(args: argparse.Namespace) -> str:
    """--base-url, else http://HOST:PORT."""
    return args.base_url or f"http://{args.host}:{args.port}"


def build_requests(args: argparse.Namespace, served: ServedModel | None) -> list[ds.ServeRequest]:
    """The dataset ``args`` name, shaped for ``args.endpoint`` and the served model's length."""
    return build_workload_requests(args, served.max_model_len if served else None, endpoint_of(args))


async def run_benchmark(requests: list[ds.ServeRequest], arrivals: list[float], *, base_url: str,
                        endpoint: str, model: str, api_key: str | None = None,
                        max_concurrency: int | None = None, progress: bool = True,
                        extra_body: dict[str, Any] | None = None) -> list[RequestOutcome]:
    """Sends each request at its offset (s from the start), at most ``max_concurrency`` in flight,
    each with the fields of ``extra_body``; returns the outcomes in send order."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {max_concurrency}.")
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    # No connection cap: a pool limit would queue requests on the client and inflate TTFT.
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=auth_headers(api_key),
                                 timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0),
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as http:
        with tqdm(total=len(requests), disable=not progress, desc="requests") as bar:
            async def one(req: ds.ServeRequest) -> RequestOutcome:
                if limit is None:
                    outcome = await send_request(http, endpoint, model, req, extra_body)
                else:
                    async with limit:
                        outcome = await send_request(http, endpoint, model, req, extra_body)
                bar.update(1)
                return outcome

            start = time.perf_counter()
            tasks = []
            for i in order:
                delay = start + arrivals[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(requests[i])))
            return list(await asyncio.gather(*tasks))


def _check_endpoint(args: argparse.Namespace, model: str, req: ds.ServeRequest,
                    extra_body: dict[str, Any] | None = None) -> None:
    """One short request before timing anything: a wrong URL, model or prompt fails fast, with the reason."""
    probe = ds.ServeRequest(req.prompt, min(req.max_tokens, CHECK_MAX_TOKENS), req.prompt_len,
                            messages=req.messages, ignore_eos=req.ignore_eos)
    base_url = base_url_of(args)
    outcome = asyncio.run(run_benchmark([probe], [0.0], base_url=base_url, endpoint=endpoint_of(args),
                                        model=model, api_key=args.api_key, progress=False,
                                        extra_body=extra_body))[0]
    if not outcome.success:
        raise ValueError(f"the check request to {base_url} failed: {outcome.error}")


def run_serve(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs the benchmark (once, or once per ``--sweep-rates`` rate), prints each report and writes
    the JSON list, the per-run files (``--save-result``) and plots asked for; returns the result objects."""
    slos = parse_goodput(args.goodput)
    metrics = parse_percentile_metrics(args.percentile_metrics)
    percentiles = parse_metric_percentiles(args.metric_percentiles)
    if args.tokenizer is not None:
        logger.warning("accepted for compatibility, has no effect: --tokenizer (prompts are token ids or "
                       "words; token counts come from the server's usage)")
    base_url, endpoint = base_url_of(args), endpoint_of(args)
    models = fetch_models(base_url, args.api_key)
    served = next((m for m in models if m.id == args.model), None) if args.model else (models or [None])[0]
    model = args.model or (served.id if served else None)
    if model is None:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model.")
    engine = served.owned_by if served and served.owned_by else "openai-compatible"
    requests = build_requests(args, served)
    fixed_arrivals = args.request_rate is None and all(r.arrival_s is not None for r in requests)
    if args.sweep_rates:
        rates: list[float | None] = list(parse_rates(args.sweep_rates))
    else:
        rate = ds.default_request_rate(args.dataset) if args.request_rate is None else args.request_rate
        rates = [None if fixed_arrivals else rate]
    structured = schema_body(load_schema(args.structured_json_schema)) if args.structured_json_schema else None
    if args.structured_rounds is not None:
        if structured is None or args.structured_rounds < 1 or len(rates) != 1:
            raise ValueError("--structured-rounds needs --structured-json-schema, N >= 1 and one rate.")
        _check_endpoint(args, model, requests[0], structured)
        return _run_structured_rounds(args, model, engine, requests, rates[0], structured)
    _check_endpoint(args, model, requests[0], structured)

    results, samples = [], []
    for rate in rates:
        arrivals = ([r.arrival_s for r in requests] if rate is None else
                    arrival_offsets(len(requests), rate, args.burstiness, args.seed))
        outcomes = asyncio.run(run_benchmark(requests, arrivals, base_url=base_url, endpoint=endpoint,
                                             model=model, api_key=args.api_key,
                                             max_concurrency=args.max_concurrency,
                                             progress=not args.no_progress, extra_body=structured))
        label = "trace" if rate is None else f"{rate:g}"
        config = {"structured_json_schema": args.structured_json_schema, "base_url": base_url,
                  "endpoint": endpoint, "dataset": args.dataset,
                  "dataset_path": args.dataset_path, "num_prompts": len(requests), "request_rate": label,
                  "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, "seed": args.seed,
                  "input_len": args.input_len, "output_len": args.output_len,
                  "input_len_range": args.input_len_range, "output_len_range": args.output_len_range,
                  "random_range_ratio": args.random_range_ratio}
        result = build_serve_result(outcomes, name=f"serve-{args.dataset}@{label}", engine=engine, model=model,
                                    config=config, slos=slos)
        result.update(vllm_run_fields(backend=args.backend, label=args.label, model=model, tokenizer=args.tokenizer,
                                      num_prompts=len(requests), rate=rate, burstiness=args.burstiness,
                                      max_concurrency=args.max_concurrency))
        result.update(vllm_result_fields(outcomes, result, metrics, percentiles))
        print(format_serve_result(result))
        results.append(result)
        samples.append(latency_samples_ms([o.timing() for o in outcomes if o.success]))
        if args.save_result:
            _save_result(args, result, label, len(rates) > 1)
    if args.output_json:
        write_results(results, args.output_json)
    if args.plot:
        _write_plots(Path(args.plot), results, samples)
    return results


def _save_result(args: argparse.Namespace, result: dict[str, Any], rate_label: str, sweep: bool) -> Path:
    """One run's result object as vLLM's ``--save-result`` file; in a sweep the rate joins the name."""
    if args.result_filename:
        name = args.result_filename
        if sweep:
            stem, dot, ext = name.rpartition(".")
            name = f"{stem}-rate{rate_label}.{ext}" if dot else f"{name}-rate{rate_label}"
    else:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = (f"{args.label or 'folovllm'}-{rate_label}qps{concurrency}-"
                f"{result['model_id'].split('/')[-1]}-{result['date']}.json")
    path = Path(args.result_dir or ".") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=True))
    print(f"wrote {path}")
    return path
def _run_structured_rounds(args: argparse.Namespace, model: str, engine: str, requests: list[ds.ServeRequest],
                           rate: float | None, structured: dict[str, Any]) -> list[dict[str, Any]]:
    """Alternates unconstrained and constrained runs of the same requests (the order flips each
    round, so a drifting machine weighs on both sides alike); prints each report and the ratio."""
    arrivals = ([r.arrival_s for r in requests] if rate is None else
                arrival_offsets(len(requests), rate, args.burstiness, args.seed))
    results: list[dict[str, Any]] = []
    tok_s: dict[bool, list[float]] = {False: [], True: []}
    base_url, endpoint = base_url_of(args), endpoint_of(args)
    for round_index in range(args.structured_rounds):
        for constrained in ((False, True) if round_index % 2 == 0 else (True, False)):
            outcomes = asyncio.run(run_benchmark(requests, arrivals, base_url=base_url, endpoint=endpoint,
                                                 model=model, api_key=args.api_key,
                                                 max_concurrency=args.max_concurrency,
                                                 progress=not args.no_progress,
                                                 extra_body=structured if constrained else None))
            side = "json-schema" if constrained else "free"
            config = {"base_url": base_url, "endpoint": endpoint, "dataset": args.dataset,
                      "num_prompts": len(requests), "max_concurrency": args.max_concurrency, "seed": args.seed,
                      "structured_json_schema": args.structured_json_schema if constrained else None,
                      "round": round_index}
            result = build_serve_result(outcomes, name=f"serve-{args.dataset}-{side}-round{round_index}",
                                        engine=engine, model=model, config=config)
            print(format_serve_result(result))
            results.append(result)
            tok_s[constrained].append(result["output_tok_s"])
    summary = overhead_summary(tok_s[False], tok_s[True])
    print(format_overhead(summary))
    results.append({"name": "structured-overhead", **summary})
    if args.output_json:
        write_results(results, args.output_json)
    return results


def _write_plots(folder: Path, results: list[dict[str, Any]], samples: list[dict[str, list[float]]]) -> None:
    from folovllm.bench.plots import plot_latency_cdfs, plot_sweep

    folder.mkdir(parents=True, exist_ok=True)
    for result, sample in zip(results, samples):
        plot_latency_cdfs(sample, folder / f"{result['name'].replace('@', '-rate')}-cdf.png", title=result["name"])
    if len(results) > 1:
        plot_sweep(results, folder / f"serve-{results[0]['config']['dataset']}-sweep.png")
