"""Tensor parallelism's step time on CPU: TP=1 vs TP=2, rank 0's step split into compute, collectives and
the hand-off of each StepInput to the other ranks; plus the hand-off alone at batch 64.

Ad hoc: dummy weights of a SmolLM2-135M-sized Llama whose heads split in two (8 query heads of 72, 2 KV
heads; SmolLM2's own 9 / 3 heads allow TP 1, 3 or 9 only). Rounds alternate TP=1 and TP=2 in one run;
medians per step are printed. Run from the repository root:

    .venv/bin/python scripts/tp_step_breakdown.py --rounds 2 --steps 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.bench.gpu_runs import save_tokenizer  # noqa: E402
from folovllm.config import EngineConfig  # noqa: E402
from folovllm.distributed.channel import receive, send_to_ranks  # noqa: E402
from folovllm.engine.llm_engine import LLMEngine  # noqa: E402
from folovllm.sample.rows import SamplingRow  # noqa: E402
from folovllm.sampling_params import SamplingParams  # noqa: E402
from folovllm.worker.step_input import ScheduledRequest, StepInput  # noqa: E402
from folovllm.worker.tp_worker import TensorParallelWorker, follower_step  # noqa: E402

SMOLLM2_SIZED = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                 "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 72,
                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                 "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}


def decode_batch_step_input(batch: int, context: int, block_size: int = 16) -> StepInput:
    """A decode step of ``batch`` requests with ``context`` tokens each: what rank 0 hands over."""
    blocks = context // block_size + 1
    return StepInput([ScheduledRequest(f"req-{i}", [1000 + i], 0, context, list(range(i * blocks, (i + 1) * blocks)),
                                       SamplingRow(SamplingParams(max_tokens=128), None, 5, (2,)))
                      for i in range(batch)])


def _echo(conn) -> None:
    while True:
        try:
            receive(conn)
        except EOFError:
            return
        conn.send_bytes(b"k")


def handoff_cost(batch: int, rounds: int = 200) -> dict:
    """Median time to reduce, pickle and send a batch-``batch`` StepInput (what rank 0 spends), and the
    round trip until the other process has decoded it and answered (an upper bound of the hand-off)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_echo, args=(theirs,), daemon=True)
    child.start()
    step = decode_batch_step_input(batch, 512)
    sends, trips = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        send_to_ranks([ours], follower_step(step))
        sent = time.perf_counter()
        ours.recv_bytes()
        trips.append(time.perf_counter() - start)
        sends.append(sent - start)
    ours.close()
    child.join()
    return {"batch": batch, "send_ms": 1e3 * statistics.median(sends),
            "round_trip_ms": 1e3 * statistics.median(trips)}


def decode_steps(model_dir: str, tp: int, threads: int, batch: int, steps: int) -> dict:
    """Median decode step at ``batch`` requests, and rank 0's split of it (``threads`` shared by the ranks)."""
    engine = LLMEngine(EngineConfig(model=model_dir, load_format="dummy", tensor_parallel_size=tp,
                                    num_threads=threads, max_model_len=1024, kv_cache_memory="1GiB"))
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, temperature=0.0)
    for i in range(batch):
        engine.add_request({"prompt_token_ids": [10 + i] * 32}, params)
    running = engine.scheduler.running
    while len(running) < batch or any(r.num_output_tokens == 0 for r in running):  # every prompt prefilled
        engine.step()
    worker = engine.worker
    group = worker.group if isinstance(worker, TensorParallelWorker) else None
    totals, collectives, sends = [], [], []
    for _ in range(steps):
        c0, s0 = (group.collective_s, worker.send_s) if group else (0.0, 0.0)
        start = time.perf_counter()
        engine.step()
        totals.append(time.perf_counter() - start)
        if group:
            collectives.append(group.collective_s - c0)
            sends.append(worker.send_s - s0)
    engine.shutdown()
    med = lambda xs: 1e3 * statistics.median(xs) if xs else 0.0  # noqa: E731
    return {"tp": tp, "threads_per_rank": engine.config.threads_per_rank, "step_ms": med(totals), "collectives_ms": med(collectives), "send_ms": med(sends),
            "compute_ms": med([t - c - s for t, c, s in zip(totals, collectives or [0] * steps, sends or [0] * steps)])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads in all (TP=2: half per rank)")
    args = parser.parse_args()
    print(json.dumps(handoff_cost(args.batch)))
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(SMOLLM2_SIZED))
        save_tokenizer(Path(folder))
        # TP=1 on all threads, TP=1 on one rank's share, TP=2: in alternating order round by round
        runs = [(1, args.threads), (1, args.threads // 2), (2, args.threads)]
        for round_index in range(args.rounds):
            for tp, threads in runs if round_index % 2 == 0 else runs[::-1]:
                result = decode_steps(folder, tp, threads, args.batch, args.steps)
                print(json.dumps({"round": round_index, **result}), flush=True)


if __name__ == "__main__":
    main()
