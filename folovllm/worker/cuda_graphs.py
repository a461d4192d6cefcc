"""CUDA graphs for decode steps: the whole step captured once per batch size, then replayed.

A captured step is everything from the input tokens to the next ones: each row's input token (the host's, or
the previous step's still on the device), the embedding, the layers, the final norm, the LM head, then the
tokens (each row's argmax; with sampled rows, temperature, top-k, top-p and min-p and the counter-keyed race
of ``Platform.sampling_race``) written to ``GraphInputs.next_tokens``, where the next step's graph reads
the ones it awaits. Replaying it launches every kernel at once, without Python in between; the host only
writes the step into pinned staging buffers and queues their copies (worker/graph_inputs.py).

Two graphs per batch size: ``greedy`` (argmax only; its hidden states kept as its output) and ``sampled``. A
step whose rows ask for more than those settings (logprobs, logits processors) replays ``greedy`` and samples
its hidden states eagerly, as does a sampled step with ``FOLOVLLM_CUDA_GRAPH_SAMPLING=off``: the same kernels,
the same noise, so the same tokens. A batch of B sequences runs in the smallest captured size with room for
B; the spare rows are padding. Steps with any prefill token, proposals, prompt logprobs or more sequences than
the largest graph run eagerly.

Needs an attention backend that never syncs with the host (the triton backend).
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from folovllm.config import EngineConfig
from folovllm.paging import blocks_for_tokens
from folovllm.platforms import Platform
from folovllm.sample.logits_processors import adjusts_row
from folovllm.sample.metadata import SamplingBatch, build_sampling_batch
from folovllm.sample.rows import SamplingRow
from folovllm.sample.sampler import Sampler, TokenLogprobs
from folovllm.worker.graph_inputs import GraphInputs
from folovllm.worker.step_input import StepInput

logger = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]
GREEDY, SAMPLED = "greedy", "sampled"
# a replayed step: tokens on the device, logprobs, needs_sync, the host copy of the tokens and its event
GraphStep = tuple[torch.Tensor, list[TokenLogprobs | None], bool, torch.Tensor, Any]


def capture_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every multiple of 8, up to and including ``max_batch``."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


def samples_in_graph(row: SamplingRow) -> bool:
    """Whether a row's token comes out of a graph: no logprobs, no logits processor (temperature, top-k, top-p,
    min-p and seeds are the graph's)."""
    return row.params.logprobs is None and not adjusts_row(row)


class CudaGraphRunner:
    """Decode-step graphs of ``model`` for a ladder of batch sizes, sharing one memory pool."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, block_size: int, max_model_len: int,
                 max_batch: int, platform: Platform, graph_sampling: bool = True) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {max_batch}")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_batch)
        self.max_blocks_per_seq = blocks_for_tokens(max_model_len, block_size)
        self.vocab_size = model.arch.vocab_size
        self.device = platform.device
        self.inputs = GraphInputs(max_batch, self.max_blocks_per_seq, block_size, self.vocab_size, platform,
                                  self.device)
        self.race = platform.sampling_race()
        self.sampler = Sampler(self.race)
        # sampled steps in their own graphs: needs the counter-keyed draw (a generator cannot be replayed)
        self.graph_sampling = graph_sampling and self.race is not None
        self.graphs: dict[tuple[int, str], Any] = {}  # (size, form) -> its torch.cuda.CUDAGraph
        self.hidden: dict[int, torch.Tensor] = {}  # each greedy graph's hidden states, in the shared pool

    def forms(self) -> tuple[str, ...]:
        return (GREEDY, SAMPLED) if self.graph_sampling else (GREEDY,)

    def padded_size(self, num_seqs: int) -> int:
        """The smallest captured batch size with room for ``num_seqs`` sequences."""
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def takes(self, step: StepInput, previous_rows: Mapping[str, int]) -> bool:
        """Whether a step runs in a graph: every request decodes one token and samples it, without proposals,
        prompt logprobs or an adapter, within the largest graph and its block tables; a token it awaits comes
        from a row of the previous step that ``next_tokens`` holds."""
        n = len(step.requests)
        if not self.graphs or n == 0 or n > self.sizes[-1]:
            return False
        for r in step.requests:
            if (r.num_new_tokens != 1 or r.sampling is None or r.draft_token_ids or r.prompt_logprobs is not None
                    or r.pooling is not None or r.lora is not None or len(r.block_table) > self.max_blocks_per_seq):
                return False
            if r.num_pending_tokens and previous_rows.get(r.request_id, self.inputs.max_batch) >= self.inputs.max_batch:
                return False
        return True

    def sampling_batch(self, size: int) -> SamplingBatch:
        """The static rows' settings as the sampler reads them: every filter applied (a row leaves one off with
        top_k = vocab, top_p = 1, min_p = 0, which changes none of its probabilities)."""
        f = self.inputs.float_field
        return SamplingBatch(num_rows=size, vocab_size=self.vocab_size, all_greedy=False, greedy_mask=None,
                             temperature=f("temperature", size), top_k=self.inputs.int_field("top_k", size),
                             top_p=f("top_p", size), min_p=f("min_p", size), generators={},
                             num_logprobs=[None] * size, max_num_logprobs=None)

    def run_step(self, size: int, form: str) -> None:
        """One decode step of ``size`` rows from the static buffers to ``next_tokens``: what a graph captures."""
        inputs = self.inputs
        hidden = self.model(inputs.input_ids(size), inputs.int_field("position", size), self.kv_caches,
                            inputs.metadata(size))
        logits = self.model.compute_logits(hidden)
        if form == GREEDY:
            self.hidden[size] = hidden
            torch.argmax(logits, dim=-1, out=inputs.next_tokens[:size])
            return
        greedy = logits.argmax(dim=-1)
        probs = Sampler.probabilities(logits, self.sampling_batch(size))
        sampled = self.race(probs, inputs.int_field("seed", size), inputs.int_field("counter", size))
        torch.where(inputs.int_field("greedy", size) != 0, greedy, sampled, out=inputs.next_tokens[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every size and form, largest first so smaller graphs reuse its pool memory.

        Every buffer row is padding meanwhile, so neither warm-up nor capture writes the KV cache.
        """
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for form in self.forms():
                for _ in range(2):  # compiles the Triton kernels for this shape before capture
                    self.run_step(size, form)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.run_step(size, form)
                self.graphs[(size, form)] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs (%s) for %d batch sizes (1..%d) in %.1f s",
                    ", ".join(self.forms()), len(self.sizes), self.sizes[-1], time.perf_counter() - start)

    @torch.inference_mode()
    def launch(self, step: StepInput, generators: Sequence[torch.Generator | None], previous_rows: Mapping[str, int],
               previous_tokens: torch.Tensor | None, noise_seed: int | None) -> GraphStep:
        """Stages a step ``takes`` accepted, replays its graph and starts the tokens' copy home.
        ``previous_rows``/``previous_tokens``: the previous step's sampling rows by request and its tokens on the
        device; ``noise_seed``: the step's seed for unseeded rows' noise (the eager sampler's too)."""
        n = len(step.requests)
        size = self.padded_size(n)
        rows = [r.sampling for r in step.requests]
        sources = [previous_rows[r.request_id] if r.num_pending_tokens else -1 for r in step.requests]
        next_tokens = self.inputs.next_tokens
        if previous_tokens is not None and max(sources) >= 0 and previous_tokens.data_ptr() != next_tokens.data_ptr():
            count = min(previous_tokens.shape[0], next_tokens.shape[0])  # an eager step's tokens, where graphs read
            next_tokens[:count].copy_(previous_tokens[:count])
        all_greedy = all(row.params.greedy for row in rows)
        self.inputs.stage(step.requests, sources, size, None if all_greedy else noise_seed)
        logprobs: list[TokenLogprobs | None] = [None] * n
        needs_sync = False
        if all(samples_in_graph(row) for row in rows) and (all_greedy or self.graph_sampling):
            self.graphs[(size, GREEDY if all_greedy else SAMPLED)].replay()
        else:  # the graph's hidden states, then the sampler as an eager step would run it
            self.graphs[(size, GREEDY)].replay()
            batch = build_sampling_batch(rows, generators, self.vocab_size, self.device,
                                         noise_seed if self.race is not None else None)
            tokens, logprobs = self.sampler.sample(self.model.compute_logits(self.hidden[size][:n]), batch)
            next_tokens[:n].copy_(tokens)
            needs_sync = batch.needs_sync
        host, ready = self.inputs.copy_home(n)
        return next_tokens[:n], logprobs, needs_sync, host, ready


def capture_decode_graphs(model: torch.nn.Module, kv_caches: KVCaches, config: EngineConfig, max_model_len: int,
                          platform: Platform) -> CudaGraphRunner | None:
    """Decode graphs when they apply (the triton backend, no ``enforce_eager``; the worker asks only on a
    platform that captures graphs), else None. ``config`` is resolved: its device and backend are not "auto"."""
    if config.attention_backend != "triton" or config.enforce_eager:
        return None
    # A decode batch never holds more sequences than the scheduler admits or its token budget.
    max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs, config.max_num_batched_tokens)
    runner = CudaGraphRunner(model, kv_caches, config.block_size, max_model_len, max_batch, platform,
                             platform.graph_sampling)
    runner.capture()
    return runner
