"""Host (CPU) time per decode step outside the model's forward, split by stage: the work overlap
scheduling must hide under a GPU step. A toy Qwen3 (one layer, hidden 32) keeps the forward cheap.

    .venv/bin/python scripts/host_overhead.py                     # batch 128, cumulative outputs
    .venv/bin/python scripts/host_overhead.py --batch 256 --output-kind final_only
    .venv/bin/python scripts/host_overhead.py --steps 940   # outputs of ~1,000 tokens: message cost grows

With cumulative outputs it also prices what the server's engine process sends per step: the step's
outputs pickled whole, or as deltas (engine/output_delta.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.bench.gpu_runs import SMOKE_CONFIG, save_placeholder_tokenizer  # noqa: E402
from folovllm.engine.output_delta import DeltaEncoder  # noqa: E402
from folovllm.engine.output_processor import OutputProcessor  # noqa: E402
from folovllm.paging import blocks_for_tokens  # noqa: E402


def timed(owner, name: str, totals: collections.Counter, key: str) -> None:
    """Replaces ``owner.name`` with a wrapper that adds its wall time to ``totals[key]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output-kind", default="cumulative", choices=["cumulative", "final_only"])
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="host-overhead-"))
    config = dict(SMOKE_CONFIG, vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  max_position_embeddings=4096)
    (folder / "config.json").write_text(json.dumps(config))
    save_placeholder_tokenizer(folder)
    max_tokens = 50 + args.steps + 10
    llm = LLM(str(folder), load_format="dummy", device="cpu", dtype="float32", num_threads=1,
              max_model_len=1024, max_num_seqs=args.batch,
              num_gpu_blocks_override=max(64, args.batch * (blocks_for_tokens(max_tokens + 10, 16) + 1)))
    engine = llm.llm_engine
    totals: collections.Counter = collections.Counter()
    timed(engine.scheduler, "schedule", totals, "schedule")
    timed(engine.worker.runner, "_prepare", totals, "prepare inputs")  # built anew or in the decode buffers
    timed(engine.worker.runner, "_forward", totals, "forward")
    timed(OutputProcessor, "make_output", totals, "build outputs")
    timed(engine, "_resolve", totals, "append tokens + stops")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                            output_kind=args.output_kind)
    for i in range(args.batch):
        engine.add_request({"prompt_token_ids": [5 + i % 100] * 10}, params)
    for _ in range(50):  # prefill done, every request decoding
        engine.step()
    totals.clear()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    per_step = (time.perf_counter() - start) / args.steps
    host = per_step - totals["forward"] / args.steps
    print(f"batch {args.batch}, {args.output_kind} outputs: {per_step * 1e3:.2f} ms per step, "
          f"{host * 1e3:.2f} ms of it outside the forward")
    for key, value in totals.items():
        if key != "forward":
            print(f"  {key:<24}{value / args.steps * 1e3:6.2f} ms")
    if args.output_kind == "cumulative":
        print_message_cost(engine)


def print_message_cost(engine) -> None:
    """One step's outputs as the engine process would send them: whole, or as deltas."""
    deltas = DeltaEncoder()
    for output in engine.step():  # what the server has already seen
        deltas.encode(output)
    outputs = engine.step()
    start = time.perf_counter()
    whole = pickle.dumps(outputs)
    whole_s = time.perf_counter() - start
    start = time.perf_counter()
    delta = pickle.dumps([deltas.encode(o) for o in outputs])
    delta_s = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs) // max(1, len(outputs))
    print(f"  message to the server   whole {len(whole) / 1024:,.0f} KB in {whole_s * 1e3:.2f} ms, "
          f"deltas {len(delta) / 1024:,.0f} KB in {delta_s * 1e3:.2f} ms (~{tokens} tokens per request)")


if __name__ == "__main__":
    main()
