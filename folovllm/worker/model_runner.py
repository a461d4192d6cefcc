"""Turns one step's plain input into one ragged forward pass and samples the next tokens.

``launch`` queues a step's work on the device and returns at once (on CUDA); ``resolve`` waits for
its sampled tokens. Between the two the engine schedules and launches the next step (overlap
scheduling); a token still on the device is fed to the next step straight from device memory.
"""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from folovllm import envs
from folovllm.lora.manager import LoRAManager
from folovllm.platforms import Platform, to_device
from folovllm.pooling.pooler import Pooler
from folovllm.sample.metadata import is_plain_greedy_row, with_noise_keys
from folovllm.sample.prompt_logprobs import DEFAULT_SLICE_ROWS, PromptLogprobsTensors, compute_prompt_logprobs
from folovllm.sample.rejection_sampler import accept_greedy, verify
from folovllm.sample.sampler import Sampler, SamplingBatch, TokenLogprobs, build_sampling_batch
from folovllm.worker.cuda_graphs import CudaGraphRunner
from folovllm.worker.decode_inputs import DecodeBatchWriter, is_decode_only
from folovllm.worker.request_states import RequestStates
from folovllm.worker.step_batch import DecodeColumns, DecodePart, StepBatch, prepare_step_batch
from folovllm.worker.step_input import StepInput, StepOutput

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]
GreedyHead = Callable[[torch.Tensor], torch.Tensor]  # hidden [N, hidden] -> each row's greedy token [N]


@dataclass
class LaunchedStep:
    """A step queued on the device; its sampled tokens are read back by ``ModelRunner.resolve``."""

    request_ids: list[str]  # the rows that sample, in order
    token_ids: torch.Tensor | None  # [len(request_ids)] on the device; None: nothing sampled
    logprobs: list | None
    needs_sync: bool = False  # a logits processor read every earlier token: the next step must wait
    host_token_ids: torch.Tensor | None = None  # the host copy (asynchronous device, graph step); valid once ``ready``
    ready: Any = None  # that copy's event (``synchronize()`` waits for it)
    prompt_logprobs: PromptLogprobsTensors | None = None  # read back by ``resolve``
    pooled: list[tuple[str, torch.Tensor]] | None = None  # pooling requests' results, read back by ``resolve``
    # a step that verified proposals: each row's emitted tokens and their logprobs, already on the host
    spec_token_ids: list[list[int]] | None = None
    spec_logprobs: list[list[TokenLogprobs | None]] | None = None
    # host seconds the launch spent building the batch's tensors, and from the forward's end on (the head's
    # tokens, or the logits and the sampler; prompt logprobs, pooling): the engine's step phases read them
    input_build_s: float = 0.0
    sampling_s: float = 0.0

    def row_of(self) -> dict[str, int]:
        return {rid: i for i, rid in enumerate(self.request_ids)}


class ModelRunner:
    """Runs one step at a time on the model and its paged KV tensors, then samples."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, block_size: int, platform: Platform,
                 cuda_graphs: CudaGraphRunner | None = None, samples: bool = True,
                 greedy_head: GreedyHead | None = None, decode_input_buffers: bool = False,
                 lora: LoRAManager | None = None) -> None:
        """``samples``: False on tensor-parallel ranks other than 0, which only take part in the
        forward and the logits gather. ``greedy_head``: takes the tokens of an all plain-greedy step
        straight from the hidden states (``CausalLM.greedy_head``); None: through the logits and sampler.
        ``decode_input_buffers``: decode-only steps write their inputs into reused host buffers
        (``worker/decode_inputs.py``; a synchronous platform only), else into a fresh block each step.
        ``lora``: the model's adapters (``enable_lora``), told each step's rows by adapter before its forward."""
        self.model = model
        self.samples = samples
        self.greedy_head = greedy_head
        self.cuda_graphs = cuda_graphs  # whole decode-step graphs (CUDA + triton backend); None: always eager
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.platform, self.device = platform, platform.device
        race = platform.sampling_race()
        self.sampler = Sampler(race, top_k_candidates=envs.switch("FOLOVLLM_TOP_K_CANDIDATES"),
                               candidate_kernel=platform.candidate_sampler())
        # each step's seed for its unseeded rows' noise keys, where the sampler draws by counter
        self._noise_seeds = random.Random(torch.initial_seed()) if race is not None else None
        self.vocab_size = model.arch.vocab_size
        self.decode_writer = DecodeBatchWriter(block_size, self.device, reuse_buffers=decode_input_buffers)
        self.states = RequestStates(self.device)  # per-request RNGs, and what is kept of decoding requests
        # the last sampling batch of decode rows alone and their request ids: the next such step with the same
        # requests in the same order samples with it (kept rows' settings do not change)
        self._sampling_cache: tuple[list[str], SamplingBatch] | None = None
        # pooling requests' results from the final hidden states (a cross-encoder's: through its score head)
        self.pooler = Pooler(getattr(model, "classify", None))
        self.lora = lora

    def launch(self, step: StepInput, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Queues the step's forward and sampling, in inference mode; ``previous`` holds the tokens its inputs
        still await. The step's ``finished_request_ids`` must have been passed to ``forget`` first."""
        if torch.is_inference_mode_enabled():  # entered once by a loop over steps (run_until_finished, core loop)
            return self._launch(step, previous)
        with torch.inference_mode():
            return self._launch(step, previous)

    def forget(self, request_id: str) -> None:
        """The request ended: its RNG, what was kept of it and its pooling state go (its id may be reused)."""
        self.states.forget(request_id)
        self.pooler.forget(request_id)
        self._sampling_cache = None

    def _launch(self, step: StepInput, previous: LaunchedStep | None) -> LaunchedStep:
        started = time.perf_counter()
        self.states.update(step)
        noise_seed = self._noise_seeds.getrandbits(62) if self._noise_seeds is not None else None
        if self.cuda_graphs is not None and self.samples:
            if step.decodes is not None and len(step.decodes):
                step = self.states.in_full(step)  # a graph stages every request from its full row
            previous_rows = previous.row_of() if previous is not None else {}
            if self.cuda_graphs.takes(step, previous_rows):
                generators = [self.states.generator(r.request_id, r.sampling.seed) for r in step.requests]
                token_ids, logprobs, needs_sync, host, ready = self.cuda_graphs.launch(
                    step, generators, previous_rows, None if previous is None else previous.token_ids, noise_seed)
                return LaunchedStep([r.request_id for r in step.requests], token_ids, logprobs, needs_sync,
                                    host_token_ids=host, ready=ready)
        batch = self._prepare(step)
        if batch.pending_inputs:
            self._fill_pending_inputs(batch, previous)
        built = time.perf_counter()
        hidden = self._forward(batch)
        forwarded = time.perf_counter()
        launched = self._after_forward(batch, hidden, noise_seed)
        launched.input_build_s, launched.sampling_s = built - started, time.perf_counter() - forwarded
        return launched

    def _after_forward(self, batch: StepBatch, hidden: torch.Tensor, noise_seed: int | None) -> LaunchedStep:
        """The step's results from its hidden states: sampled tokens, prompt logprobs, pooled vectors.
        ``noise_seed``: the step's seed for its unseeded rows' noise keys (None: the sampler draws no keyed noise)."""
        if not self.samples:
            self._join_logits_gathers(batch, hidden)
            return LaunchedStep([], None, None)
        prompt_logprobs = None
        if batch.prompt_logprobs is not None:
            prompt_logprobs = compute_prompt_logprobs(hidden, batch.prompt_logprobs, self.model.compute_logits)
        pooled = self.pooler.pool(hidden, batch.pooling) if batch.pooling else None
        if not batch.sampling_rows:
            return LaunchedStep([], None, None, prompt_logprobs=prompt_logprobs, pooled=pooled)
        sampled_hidden = _sampled_rows(hidden, batch)
        if batch.draft_token_ids:
            return self._verify(batch, sampled_hidden, prompt_logprobs, pooled)
        plain_greedy = batch.plain_greedy
        if plain_greedy is None:
            plain_greedy = all(is_plain_greedy_row(row) for row in batch.sampling_rows)
        if self.greedy_head is not None and plain_greedy:
            # the head's tokens are the sampler's argmax; the sampling batch would go unread
            token_ids = self.greedy_head(sampled_hidden)
            logprobs: list[TokenLogprobs | None] = [None] * len(batch.sampling_rows)
            needs_sync = False
        else:
            sampling_batch = self._sampling_batch(batch, noise_seed)
            logits = self.model.compute_logits(sampled_hidden)
            token_ids, logprobs = self.sampler.sample(logits, sampling_batch)
            needs_sync = sampling_batch.needs_sync
        launched = LaunchedStep(batch.sampling_request_ids, token_ids, logprobs, needs_sync,
                                prompt_logprobs=prompt_logprobs, pooled=pooled)
        if self.platform.asynchronous:  # start the copy home now; resolve() only waits for it
            launched.host_token_ids, launched.ready = self.platform.copy_home(token_ids)
        return launched

    def _sampling_batch(self, batch: StepBatch, noise_seed: int | None) -> SamplingBatch:
        """The step's sampling tensors: the last ones again for a step of the same decode rows alone, with this
        step's noise keys where it has any (the output counts move on every step)."""
        request_ids = batch.sampling_request_ids
        cached = self._sampling_cache
        if batch.kept_rows_only and cached is not None and cached[0] == request_ids:
            sampling_batch = cached[1]
            if sampling_batch.all_greedy or (noise_seed is None and sampling_batch.noise_counters is None):
                return sampling_batch
            return with_noise_keys(sampling_batch, batch.sampling_rows, noise_seed, self._output_counts(batch))
        states = self.states
        generators = [states.generator(rid, row.seed) for rid, row in zip(request_ids, batch.sampling_rows)]
        sampling_batch = build_sampling_batch(batch.sampling_rows, generators, self.vocab_size, self.device,
                                              noise_seed, self._output_counts(batch))
        self._sampling_cache = (request_ids, sampling_batch) if batch.kept_rows_only else None
        return sampling_batch

    @staticmethod
    def _output_counts(batch: StepBatch) -> np.ndarray | None:
        """Each sampling row's output count, where its kept decode rows' own rows are out of date (None: none)."""
        counts = batch.decode_output_counts
        if counts is None or batch.kept_rows_only:
            return counts
        rows = batch.sampling_rows
        head = np.fromiter((row.num_output_tokens for row in rows[:len(rows) - len(counts)]), np.int64)
        return np.concatenate([head, counts])

    def _verify(self, batch: StepBatch, sampled_hidden: torch.Tensor,
                prompt_logprobs: PromptLogprobsTensors | None, pooled: list | None) -> LaunchedStep:
        """A step with proposals: every proposal's row scored, the kept tokens read back at once (the
        engine turns overlap off while speculating, so nothing waits on this step's tokens)."""
        drafts = batch.draft_token_ids
        starts = list(itertools.accumulate((len(d) + 1 for d in drafts), initial=0))  # each request's first row
        if self.greedy_head is not None and all(is_plain_greedy_row(row) for row in batch.sampling_rows):
            target = self.greedy_head(sampled_hidden).tolist()
            emitted = [accept_greedy(target[start:start + len(d) + 1], d) for start, d in zip(starts, drafts)]
            logprobs = [[None] * len(tokens) for tokens in emitted]
        else:
            generators = [self.states.generator(rid, batch.sampling_rows[start].seed)
                          for rid, start in zip(batch.sampling_request_ids, starts)]
            logits = self.model.compute_logits(sampled_hidden)
            emitted, logprobs = verify(logits, batch.sampling_rows, drafts, generators, self.sampler)
        first = torch.tensor([tokens[0] for tokens in emitted], device=self.device)
        return LaunchedStep(batch.sampling_request_ids, first, None, prompt_logprobs=prompt_logprobs, pooled=pooled,
                            spec_token_ids=emitted, spec_logprobs=logprobs)

    @staticmethod
    def resolve(launched: LaunchedStep) -> StepOutput:
        """Waits for the step's sampled tokens and hands them over as host lists."""
        start = time.perf_counter()
        prompt_logprobs = launched.prompt_logprobs.to_host() if launched.prompt_logprobs is not None else []
        pooled = [(rid, result.tolist()) for rid, result in launched.pooled or ()]
        if launched.token_ids is None:
            return StepOutput(prompt_logprobs=prompt_logprobs, wait_s=time.perf_counter() - start, pooled=pooled)
        if launched.host_token_ids is not None:
            if launched.ready is not None:
                launched.ready.synchronize()
            ids = launched.host_token_ids.tolist()
        else:
            ids = launched.token_ids.tolist()
        if launched.spec_token_ids is not None:
            return StepOutput(launched.request_ids, ids, [row[0] for row in launched.spec_logprobs], prompt_logprobs,
                              time.perf_counter() - start, pooled, launched.spec_token_ids, launched.spec_logprobs)
        return StepOutput(launched.request_ids, ids, launched.logprobs, prompt_logprobs,
                          time.perf_counter() - start, pooled)

    def _join_logits_gathers(self, batch: StepBatch, hidden: torch.Tensor) -> None:
        """A rank that does not sample computes its vocab slice of the same logits rank 0 asks for,
        call for call, so that every gather of rank 0 is met."""
        if batch.prompt_logprobs is not None:  # rank 0 turns these rows into logits a slice at a time
            rows = batch.prompt_logprobs.row_indices
            for start in range(0, len(rows), DEFAULT_SLICE_ROWS):
                self.model.compute_logits(hidden[rows[start:start + DEFAULT_SLICE_ROWS]])
        if batch.sampling_rows:
            self.model.compute_logits(_sampled_rows(hidden, batch))

    @staticmethod
    def _fill_pending_inputs(batch: StepBatch, previous: LaunchedStep | None) -> None:
        """Copies the previous step's sampled tokens into this step's inputs, device to device."""
        if previous is None or previous.token_ids is None:
            raise RuntimeError("a step needs tokens from a step that is not in flight")
        pending = batch.pending_inputs
        if len(pending) == batch.input_ids.shape[0] and [rid for _, rid in pending] == previous.request_ids:
            batch.input_ids.copy_(previous.token_ids)  # every row, the same requests in the same order: one copy
            return
        rows = previous.row_of()
        device = batch.input_ids.device
        dst = to_device([row for row, _ in batch.pending_inputs], torch.int64, device)
        src = to_device([rows[rid] for _, rid in batch.pending_inputs], torch.int64, device)
        batch.input_ids[dst] = previous.token_ids[src].to(batch.input_ids.dtype)

    def _prepare(self, step: StepInput) -> StepBatch:
        """The step's batch, its adapters told to the LoRA manager: decode rows from the kept state in bulk."""
        adapters = [(r.lora, r.num_new_tokens) for r in step.requests] if self.lora is not None else []
        decodes = step.decodes
        if decodes is not None and len(decodes):
            states = self.states
            rows = states.rows(decodes.request_ids)
            width = int(states.num_blocks[rows].max())
            columns = DecodeColumns(np.asarray(decodes.token_ids, dtype=np.int64),
                                    np.asarray(decodes.positions, dtype=np.int64), states.tables[rows, :width])
            rows_list = rows.tolist()
            sampling = list(map(states.sampling.__getitem__, rows_list))
            if step.requests:
                batch = prepare_step_batch(step, self.block_size, self.device,
                                           DecodePart(columns, sampling, decodes.request_ids, decodes.pending_rows))
            else:
                batch = self.decode_writer.batch(columns, sampling, decodes.request_ids)
                batch.pending_inputs = [(row, decodes.request_ids[row]) for row in decodes.pending_rows]
                batch.kept_rows_only = True
            batch.decode_output_counts = states.output_counts(rows, columns.positions)
            if bool(states.plain_greedy[rows].all()) and all(
                    is_plain_greedy_row(r.sampling) for r in step.requests if r.sampling is not None):
                batch.plain_greedy = True  # else left to the sampling rows (proposals' rows among them)
            if self.lora is not None:
                adapters += ([(states.lora[row], 1) for row in rows_list] if states.any_lora
                             else [(None, len(rows_list))])
        elif step.requests and is_decode_only(step):
            batch = self.decode_writer.batch(DecodeColumns.from_requests(step.requests),
                                             [r.sampling for r in step.requests],
                                             [r.request_id for r in step.requests])
        else:
            batch = prepare_step_batch(step, self.block_size, self.device)
        if self.lora is not None:
            self.lora.set_batch(adapters)
        return batch

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        """Hidden states of the step, run eagerly (a step a decode graph takes never gets here)."""
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.attn_metadata)


def _sampled_rows(hidden: torch.Tensor, batch: StepBatch) -> torch.Tensor:
    """The hidden states whose next token is sampled: all of them as they are when every row samples
    (the logits rows are distinct and increasing, so as many as there are rows is every row in order)."""
    if len(batch.sampling_rows) == hidden.shape[0]:
        return hidden
    return hidden[batch.logits_indices]
