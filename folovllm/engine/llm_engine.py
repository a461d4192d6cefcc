"""The engine: owns scheduler, KV cache manager and output processing; its worker owns the device.

    step():  schedule  ->  the worker runs one ragged batch  ->  append tokens, stop, free

With overlap scheduling (CUDA by default) the last part moves one call later: step() schedules and
launches step N+1 while step N still runs on the device, then resolves N. Tokens of N that N+1 needs
go device to device; a request that N finishes has its N+1 token dropped.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time

import torch

from folovllm import envs
from folovllm.config import EngineConfig
from folovllm.core.admission import make_admission
from folovllm.attention.kv_quant import kv_cache_format
from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.policy import make_policy
from folovllm.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from folovllm.distributed.launch import RankFailedError
from folovllm.engine.fault_isolation import isolate_faults, subset
from folovllm.engine.output_processor import OutputProcessor, RequestGroup
from folovllm.engine.pooling import RequestParams, model_pooling
from folovllm.engine.request_intake import ModelLimits, PromptInput, RequestIntake
from folovllm.engine.stats import EngineStats, StepStats, step_cost_terms
from folovllm.engine.step_phases import PhaseClock
from folovllm.engine.step_results import StepResults
from folovllm.engine.worker_input import StepInputBuilder
from folovllm.kv_transfer.base import ConnectorSide, KVConnectorBase
from folovllm.kv_transfer.setup import kv_transfer_settings, make_connector
from folovllm.lora.request import LoRARequest
from folovllm.model.loader import default_model_path
from folovllm.model.loader.generation_config import default_sampling_overrides
from folovllm.model.loader.hub import resolve_model_files
from folovllm.model.loader.tokenizer import load_tokenizer
from folovllm.outputs import RequestOutput
from folovllm.platforms import platform_for
from folovllm.request import Request, RequestStatus
from folovllm.spec_decode.speculator import make_speculator
from folovllm.structured_output import GrammarCache, StructuredOutputManager
from folovllm.worker.model_runner import LaunchedStep
from folovllm.worker.tp_worker import TensorParallelWorker
from folovllm.worker.worker import Worker

logger = logging.getLogger(__name__)

KV_TRANSFER_POLL_S = 0.005  # an engine with only KV transfers under way sleeps this long per step


@dataclasses.dataclass
class InFlight:
    """A step launched on the worker whose tokens are not applied yet."""

    sched: SchedulerOutput
    sampled: list[Request]  # the requests it samples a token for, in row order
    launched: LaunchedStep
    num_decode: int  # its decode tokens, counted before num_computed_tokens moved
    context_tokens: int  # tokens its attention reads, summed over the batch (the step trace's cost term)
    pairs: tuple[int, int]  # its prefill chunks' (cached, new) attention pairs (more cost terms)
    started: float  # when the engine step that scheduled it began


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        if config.data_parallel_size > 1:  # one LLMEngine is one replica; the server runs N of them
            raise ValueError(f"data_parallel_size={config.data_parallel_size}: data parallelism is a server "
                             "feature (`folovllm serve --data-parallel-size N` runs N engine replicas behind "
                             "one API server); offline, use data_parallel_size=1")
        given = resolve_model_files(config)  # hub ids to paths
        config = given.resolve()  # every "auto" decided here, once
        self.config = config
        for line in given.ignored_settings(config.device):  # what the user set, not what resolve derived
            logger.warning(line)
        self.device = config.torch_device
        self.platform = platform_for(self.device, config.batch_invariant)
        # what runs this engine: the device, and on a CPU its tier (start-up log, /metrics, result JSON)
        self.platform_info = self.platform.describe()
        logger.info("platform: %s", ", ".join(f"{k}={v}" for k, v in self.platform_info.items()))
        self.model_path = config.model or default_model_path()
        self.worker = (TensorParallelWorker(config, self.model_path) if config.tensor_parallel_size > 1
                       else Worker(config, self.model_path))
        self.tokenizer = load_tokenizer(config.tokenizer or self.model_path)
        # SamplingParams fields the model's generation_config.json sets (vLLM's --generation-config)
        self.default_sampling = default_sampling_overrides(self.model_path, config.generation_config)
        arch = self.worker.arch
        self.vocab_size = arch.vocab_size
        self.max_model_len = self._resolve_max_model_len(arch.max_position_embeddings)
        self.eos_token_ids = list(arch.eos_token_ids)
        self.hidden_size = arch.hidden_size
        # runner="pooling": the model's pooling (None: it generates); a cross-encoder scores text pairs
        self.pooler_config, self.cross_encoder = model_pooling(config.runner, config.pooler_config,
                                                               self.model_path, arch.architecture)

        num_blocks = self.worker.determine_num_kv_blocks(self.max_model_len)
        if num_blocks * config.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {num_blocks * config.block_size} tokens, fewer than "
                f"max_model_len={self.max_model_len}; give it more memory or lower max_model_len")
        model_key = f"{self.model_path}|{config.load_format}|{config.seed}|{config.torch_dtype}|{config.quantization}"
        reserve = self.max_model_len if config.kv_layout == "contiguous" else 0
        self.kv_cache = KVCacheManager(num_blocks, config.block_size,
                                       config.enable_prefix_caching, model_key, reserve)
        self.worker.initialize_cache(num_blocks, self.max_model_len)
        self.kv_connector = self._start_kv_connector(config)
        max_batched = config.max_num_batched_tokens
        if not config.enable_chunked_prefill and max_batched < self.max_model_len:
            logger.info("chunked prefill is off: max_num_batched_tokens raised to max_model_len=%d",
                        self.max_model_len)
            max_batched = self.max_model_len
        self.scheduler = Scheduler(
            SchedulerLimits(max_batched, config.max_num_seqs, self.max_model_len,
                            config.enable_chunked_prefill, config.long_prefill_token_threshold,
                            config.max_loras if config.enable_lora else 0),
            self.kv_cache,
            make_policy(config.scheduling_policy, config.max_queue_delay, config.tenant_weights),
            make_admission(config, num_blocks, max_batched), connector=self.kv_connector,
            bulk_decodes=envs.switch("FOLOVLLM_BULK_DECODES"))
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len)
        self.intake = RequestIntake(self.tokenizer, ModelLimits(
            self.max_model_len, self.vocab_size, tuple(self.eos_token_ids), self.hidden_size, config.max_logprobs,
            self.pooler_config, self.cross_encoder))
        self.structured = StructuredOutputManager(GrammarCache(
            config.structured_outputs_backend, self.tokenizer, self.vocab_size, self.eos_token_ids))
        self.overlap = config.overlap_scheduling
        self.inputs = StepInputBuilder(self.structured, envs.switch("FOLOVLLM_DECODE_ROWS"))
        self._in_flight: InFlight | None = None
        self._ids = itertools.count()
        self._step_started = 0.0
        self.stats = EngineStats()
        self.phases = PhaseClock()  # host seconds per phase of the steps (folovllm bench host)
        # proposals each step (overlap is off with them: config.resolve)
        self.speculator = make_speculator(config, self.structured, self.stats, self.vocab_size, self.max_model_len)
        self.results = StepResults(self.scheduler, self.kv_cache, self.structured, self.output_processor,
                                   self.stats, self.speculator, self.phases,
                                   batched=envs.switch("FOLOVLLM_BATCHED_OUTPUTS"))
        # Line-buffered so a trace is complete up to the last step even if the process is killed.
        self._trace = open(config.trace_path, "w", buffering=1) if config.trace_path else None

    @property
    def groups(self) -> dict[str, RequestGroup]:
        """The requests in the engine, by user request id (the step results hold them)."""
        return self.results.groups

    # -- start-up -----------------------------------------------------------------------------

    def _start_kv_connector(self, config: EngineConfig) -> KVConnectorBase | None:
        """PD disaggregation: the connector's scheduler side here, its worker side on the worker."""
        if config.kv_role is None:
            return None
        settings = kv_transfer_settings(config)
        connector = make_connector(config, ConnectorSide.SCHEDULER, settings)
        worker_side = make_connector(config, ConnectorSide.WORKER, settings)
        connector.set_handshake_metadata(self.worker.attach_kv_connector(worker_side))
        logger.info("KV transfer: role %s, connector %s, engine id %s", config.kv_role, connector.name,
                    settings.engine_id)
        return connector

    def _resolve_max_model_len(self, model_max: int) -> int:
        wanted = self.config.max_model_len
        if wanted is None:
            return model_max
        if wanted > model_max:
            raise ValueError(f"max_model_len={wanted} exceeds the model's maximum of {model_max}")
        return wanted

    # -- requests -----------------------------------------------------------------------------

    def add_request(self, prompt: PromptInput, params: RequestParams,
                    request_id: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None, priority: int = 0, user: str | None = None,
                    lora_request: LoRARequest | None = None) -> str:
        """Validates and queues one request; raises ValueError on bad input (nothing is queued).

        ``cache_salt`` (or a ``"cache_salt"`` key in a dict prompt) keeps the request's KV blocks
        apart from every request with another salt: tenants opt out of sharing prefixes.
        ``lora_request``: the adapter it runs with (``enable_lora``); loaded and checked here.
        """
        request_id = request_id if request_id is not None else str(next(self._ids))
        group = self._new_group(prompt, params, request_id, arrival_time, cache_salt, priority, user,
                                lora_request)
        self._queue(group)
        return request_id

    def add_requests(self, prompts: list[PromptInput], params: RequestParams, request_ids: list[str],
                     arrival_time: float | None = None, priority: int = 0,
                     user: str | None = None, lora_request: LoRARequest | None = None) -> None:
        """Queues several prompts with the same parameters, all or nothing: a ValueError for any
        of them (or a repeated id) queues none."""
        if len(set(request_ids)) != len(request_ids) or len(request_ids) != len(prompts):
            raise ValueError("add_requests needs one distinct request id per prompt")
        groups = [self._new_group(prompt, params, request_id, arrival_time, None, priority, user, lora_request)
                  for prompt, request_id in zip(prompts, request_ids)]
        for group in groups:
            self._queue(group)

    def _new_group(self, prompt: PromptInput, params: RequestParams, request_id: str,
                   arrival_time: float | None, cache_salt: str | None, priority: int,
                   user: str | None, lora_request: LoRARequest | None = None) -> RequestGroup:
        """The request's samples, validated and admissible; the engine's queues are not touched."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        group = self.intake.build(prompt, params, request_id, arrival_time, cache_salt, priority, user, lora_request)
        if lora_request is not None:
            self.add_lora(lora_request)
        for sample in group.samples:
            self.scheduler.check_admissible(sample)
            self.output_processor.start(sample)
        return group

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Loads and checks an adapter into the worker's CPU pool (ValueError naming what does not fit)."""
        if not self.config.enable_lora:
            raise ValueError(f"request names LoRA adapter {lora_request.lora_name!r}, but LoRA is off; "
                             "start the engine with enable_lora=True (--enable-lora)")
        self.worker.add_lora(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drops an adapter from the worker's pool and slot (a request still using it loads it again)."""
        return self.worker.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        """The ids of the adapters loaded in the worker's pool."""
        return self.worker.list_loras() if self.config.enable_lora else []

    def _queue(self, group: RequestGroup) -> None:
        self.groups[group.request_id] = group
        now = time.perf_counter()
        for sample in group.samples:
            sample.metrics.queued_time = now
            self.structured.add_request(sample)  # its grammar compiles while it waits
            self.scheduler.add_request(sample)

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """A prompt's text (if it has one) and token ids."""
        return self.intake.tokenize(prompt)

    def abort_request(self, request_id: str) -> None:
        group = self.groups.pop(request_id, None)
        if group is None:
            return
        for sample in group.samples:
            self.results.finish(sample, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """Requests to step, a step in flight, or KV held for another instance (it is freed by a step)."""
        return self.scheduler.has_unfinished() or self._in_flight is not None or bool(self.kv_cache.held)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Runs one iteration; returns an output for every request that made progress or ended.

        With overlap, the step launched here is resolved by the next call (its outputs come then).
        A request the step fails on ends with finish_reason "error"; the others go on unchanged.
        """
        started = self._step_started = time.perf_counter()
        self.phases.start()
        touched: dict[str, RequestGroup] = {}
        wait_s = 0.0
        previous = self._in_flight
        self._in_flight = None
        if previous is not None and previous.launched.needs_sync:
            wait_s += self._resolve(previous, touched)  # a logits processor reads every earlier token
            previous = None
        self._update_grammars(touched)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        sched = self.scheduler.schedule()
        self.phases.lap("schedule")
        if sched.is_empty and previous is None and self.structured.has_compiling:
            self.structured.wait(0.02)  # only grammars are pending: do not spin
            self.phases.start()
        elif sched.is_empty and previous is None and self.kv_connector is not None:
            time.sleep(KV_TRANSFER_POLL_S)  # only KV transfers are under way: do not spin
            self.phases.start()
        if not sched.is_empty:
            try:
                self._in_flight = self._launch(sched)
            except RankFailedError:  # no request's fault, and no retry can run: the engine is done
                raise
            except Exception as err:
                if previous is not None:  # settle it first: the retries take its tokens from the host
                    wait_s += self._resolve(previous, touched)
                    previous = None
                wait_s += self._run_isolating_faults(sched, err, touched)
        if previous is not None:
            wait_s += self._resolve(previous, touched)
        if self._in_flight is not None and not self.overlap:
            wait_s += self._resolve(self._in_flight, touched)
            self._in_flight = None
        if self.kv_connector is not None:  # after the finishes: a producer's KV is out before its output
            self._transfer_kv()
            self.phases.lap("launch")
        outputs = self._collect_outputs(touched)
        self.phases.lap("output processing")
        self.stats.host_time_s += time.perf_counter() - started - wait_s
        return outputs

    def _transfer_kv(self) -> None:
        """Hands this step's KV orders to the worker and applies the transfers that ended."""
        result = self.worker.kv_transfer(self.kv_connector.build_connector_meta())
        waiting = self.scheduler.waiting_for_kv
        for request_id in result.failed_recving:
            if request_id in waiting:
                logger.warning("request %s: its KV could not be pulled; computing its prefill locally",
                               request_id)
        ended = [waiting[i] for i in result.finished_recving | result.failed_recving if i in waiting]
        self.stats.record_kv_transfers(result, ended)
        self.scheduler.update_from_kv_transfers(result)

    def _run_isolating_faults(self, sched: SchedulerOutput, error: Exception,
                              touched: dict[str, RequestGroup]) -> float:
        """The step failed to launch: relaunch it in parts (engine/fault_isolation.py), keep the
        parts that run, end the requests it fails on. Synchronous: nothing stays in flight."""
        logger.error("a step of %d requests failed; looking for the request(s) it fails on",
                     len(sched.requests), exc_info=error)
        num_decode, context, pairs = step_cost_terms(sched)
        live = subset(sched, [i for i, r in enumerate(sched.requests) if not r.status.finished])
        parts, culprits = isolate_faults(live, self._launch)
        wait_s = sum(self._take_tokens(step, touched) for _, step in parts)
        if culprits:
            logger.error("ending the request(s) the step fails on with finish_reason 'error': %s",
                         ", ".join(r.request_id for r in culprits))
        for request in culprits:
            self.results.fail_group(request.parent_id, touched)
        self._record_step(time.perf_counter(), sched, num_decode, context, pairs, self._step_started)
        return wait_s

    def _update_grammars(self, touched: dict[str, RequestGroup]) -> None:
        """Requests whose grammar compiled may be scheduled; one whose grammar failed ends alone."""
        for request, reason in self.structured.update():
            logger.warning("request %s: %s", request.parent_id, reason)
            self.results.fail_group(request.parent_id, touched, reason)

    def _collect_outputs(self, touched: dict[str, RequestGroup]) -> list[RequestOutput]:
        """One output per group that made progress (final_only groups: only when finished)."""
        outputs = []
        for group in touched.values():
            finished = group.finished
            if finished or not group.final_only:
                outputs.append(OutputProcessor.make_output(group))
            if finished:
                del self.groups[group.request_id]
        return outputs

    def _launch(self, sched: SchedulerOutput) -> InFlight:
        """Hands a scheduled batch to the worker; its tokens count as pending until ``_resolve``.
        Nothing changes if the worker raises, so a failed batch can be launched again in parts."""
        num_decode, context, pairs = step_cost_terms(sched)  # before num_computed_tokens moves
        step_input, sampled = self.inputs.build(sched, self.results.finished_ids)
        self.phases.lap("input build")
        launched = self.worker.launch(step_input)
        self.phases.lap_launch(launched.input_build_s, launched.sampling_s)
        self.inputs.launched(step_input)
        self.results.finished_ids = []
        for request, num_new in zip(sched.requests, sched.num_new_tokens):
            request.num_computed_tokens += num_new
        for request in sampled:
            request.num_pending_tokens += 1
        self.phases.lap("launch")
        return InFlight(sched, sampled, launched, num_decode, context, pairs, self._step_started)

    def _resolve(self, step: InFlight, touched: dict[str, RequestGroup]) -> float:
        """Takes a launched step's sampled tokens and records the step. Returns the time spent
        waiting for the device."""
        wait_s = self._take_tokens(step, touched)
        self._record_step(time.perf_counter(), step.sched, step.num_decode, step.context_tokens, step.pairs,
                          step.started)
        self.phases.lap("output processing")
        return wait_s

    def _take_tokens(self, step: InFlight, touched: dict[str, RequestGroup]) -> float:
        """The step's results applied to its requests (engine/step_results.py); if reading the tokens back
        fails, every request of the step ends (its tokens may already feed a later step, so it cannot be
        relaunched). Returns the time spent waiting for the device."""
        try:
            out = self.worker.resolve(step.launched)
        except Exception:
            logger.exception("reading a step's sampled tokens failed; ending its %d requests",
                             len(step.sched.requests))
            for request in step.sched.requests:
                self.results.fail_group(request.parent_id, touched)
            return 0.0
        self.phases.lap("output processing", out.wait_s)
        self.results.apply(step.sched, step.sampled, out, touched)
        return out.wait_s

    def _record_step(self, now: float, sched: SchedulerOutput, num_decode: int, context: int,
                     pairs: tuple[int, int], started: float) -> None:
        step = StepStats(
            time=now, num_prefill_tokens=sched.total_num_tokens - num_decode, num_decode_tokens=num_decode,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted), kv_blocks_used=self.kv_cache.num_used_blocks,
            kv_usage=self.kv_cache.usage, num_scheduled=len(sched.requests), context_tokens=context,
            prefill_cached_pairs=pairs[0], prefill_new_pairs=pairs[1], duration_s=now - started)
        self.stats.record_step(step, len(sched.preempted), self.kv_cache.prefix_cache_queries,
                               self.kv_cache.prefix_cache_hits)
        if self._trace is not None:
            self._trace.write(json.dumps(dataclasses.asdict(step)) + "\n")

    def check_health(self) -> None:
        """Raises RankFailedError if a tensor-parallel rank has died (a single worker is always fine)."""
        self.worker.check_health()

    def shutdown(self) -> None:
        """Stops the tensor-parallel ranks, if any (they also stop when this process exits)."""
        self.worker.close()

    @property
    def model(self) -> torch.nn.Module:
        """The local worker's model, for tools that inspect it or load other weights into it."""
        return self.worker.model

    def reset_prefix_cache(self) -> int:
        """Drops every cached block that no running request uses; returns how many."""
        return self.kv_cache.reset_prefix_cache()

    def cache_config_info(self) -> dict[str, str]:
        """The KV cache settings as label values (the ``cache_config_info`` metric)."""
        config = self.config
        kv_format = kv_cache_format(config.kv_cache_dtype)
        return {"block_size": str(config.block_size),
                "cache_dtype": str(config.torch_dtype).removeprefix("torch.") if kv_format is None else kv_format.name,
                "num_cache_tokens": str(self.kv_cache.num_blocks * config.block_size),
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "gpu_memory_utilization": str(config.gpu_memory_utilization),
                "num_gpu_blocks": str(self.kv_cache.num_blocks), "prefix_caching_hash_algo": "sha256"}

    def get_kv_cache_stats(self) -> dict:
        return self.kv_cache.stats()

