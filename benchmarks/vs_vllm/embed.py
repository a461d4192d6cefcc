"""The embedding phase of compare.py: every engine variant built as a pooling engine (``runner="pooling"``,
``convert="embed"``: the decoder's final normed hidden state of the last token, normalized), the same
token-id inputs, one ``embed`` call of all of them per timed run, alternating rounds; the figure is input
tokens per second, and the vectors of vLLM's first variant and ours are compared (cosine)."""
from __future__ import annotations

import math
import random
from typing import Any, Callable

import report
from engines import Setup, Worker, label

POOLING_ARGS = {"runner": "pooling", "convert": "embed"}
KEPT_VECTORS = 16  # vectors per engine compared between vLLM and ours


def embed_prompts(num: int, length: int, vocab: int = 49152, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(num)]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed_phase(setup: Setup, engines: tuple[str, ...], shape: tuple[int, int], rounds: int, timer: Any,
                order: Callable[[tuple[str, ...], int], tuple[str, ...]],
                start_all: Callable[..., tuple[dict[str, Worker], dict[str, Any]]], rss: Any,
                ready: Callable[[Worker], dict[str, Any]]) -> dict[str, Any]:
    print(f"embeddings: starting {', '.join(map(label, engines))} as pooling engines", flush=True)
    workers, startup = start_all(engines, lambda e: Worker(e, setup, POOLING_ARGS, phase="embed"), ready, timer, rss)
    prompts = embed_prompts(*shape)
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    kept: dict[str, list[list[float]]] = {}
    try:
        for w in workers.values():
            w.embed(prompts[:8])
        for r in range(rounds):
            for engine in order(engines, r):
                worker = workers[engine]
                done, meta = timer.run(worker.proc, lambda: worker.embed(prompts, KEPT_VECTORS))
                rate = done["input_tokens"] / done["wall_s"]
                runs[engine].append({"value": rate, "inputs_s": done["num_inputs"] / done["wall_s"],
                                     "wall_s": done["wall_s"], **meta})
                kept.setdefault(engine, done["vectors"])
                print(f"  round {r + 1}/{rounds} embed {engine:<10} {rate:9.1f} input tok/s "
                      f"others {meta['others_share']:.0%}", flush=True)
    finally:
        for w in workers.values():
            w.close()
    pair = [e for e in engines if report.is_vllm(e)][:1] + [e for e in engines if not report.is_vllm(e)][:1]
    agreement = None
    if len(pair) == 2:
        cosines = [cosine(a, b) for a, b in zip(kept[pair[0]], kept[pair[1]])]
        agreement = {"engines": pair, "min_cosine": min(cosines), "num_compared": len(cosines)}
    return {"engines": list(engines), "shape": {"num_inputs": shape[0], "input_len": shape[1]},
            "startup": startup, "runs": runs,
            "median": {e: report.median([x["value"] for x in runs[e]]) for e in engines},
            "median_inputs_s": {e: report.median([x["inputs_s"] for x in runs[e]]) for e in engines},
            "agreement": agreement}
