"""The engine-core loop and the messages it trades with the server, wherever the loop runs.

    server (asyncio)                            engine core (a thread or its own process)
    AddOp / AbortOp / STOP  ── inbox ──►        apply them in order, step() once, then
    IterationMessage        ◄── emit ──         one message: accepted adds, outputs, metrics snapshot

The loop only touches its LLMEngine; everything it tells the server is plain data that pickles, so
the same loop runs on a thread (engine/core_client.py ThreadCore) or in a child process (ProcessCore).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from folovllm.distributed.launch import RankFailedError
from folovllm.engine.errors import EngineError, EngineShutdownError
from folovllm.engine.llm_engine import LLMEngine, PromptInput
from folovllm.engine.output_delta import DeltaEncoder, OutputDelta
from folovllm.engine.stats import EngineStats
from folovllm.lora.request import LoRARequest
from folovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


# -- server -> core ------------------------------------------------------------------------------

@dataclass
class AddOp:
    """Queue one prompt per request id, all or nothing (a request's prompt list is one op)."""

    request_ids: list[str]
    prompts: list[PromptInput]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    user: str | None = None
    lora_request: LoRARequest | None = None


@dataclass
class LoRAOp:
    """Load and check an adapter into the pool (``load``), or drop the one with ``lora_request``'s id; answered
    in ``accepted`` under ``op_id``."""

    op_id: str
    lora_request: LoRARequest
    load: bool = True


@dataclass
class AbortOp:
    request_id: str


@dataclass
class StopOp:
    """Abort whatever is left, answer with a final message, end the loop."""


Op = AddOp | AbortOp | StopOp | LoRAOp
# Returns every op queued so far, in order; when ``block`` is true it waits for at least one.
Inbox = Callable[[bool], list[Op]]


# -- core -> server ------------------------------------------------------------------------------

@dataclass
class EngineInfo:
    """What the server needs to know about the engine it cannot see (sent once, at start-up)."""

    model_path: str
    max_model_len: int
    # SamplingParams fields the model's generation config sets: a request that omits one gets these
    default_sampling: dict = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)  # LLMEngine.cache_config_info()
    data_parallel_size: int = 1  # engine replicas behind the server (their snapshots say which is which)
    kv_role: str | None = None  # PD disaggregation: the engine's --kv-role
    weight_bytes: int = 0  # the model's weights as this engine holds them (quantized: packed)
    platform: dict[str, str] = field(default_factory=dict)  # LLMEngine.platform_info: device, CPU tier
    cross_encoder: bool = False  # a pooling model that scores text pairs through its head (LLMEngine.cross_encoder)
    vocab_size: int = 0  # the model's: token ids a request names are below it
    pooling: bool = False  # runner "pooling": it embeds and scores, it does not generate


def engine_info(engine: LLMEngine) -> EngineInfo:
    return EngineInfo(engine.model_path, engine.max_model_len, engine.default_sampling, engine.cache_config_info(),
                      kv_role=engine.config.kv_role, weight_bytes=engine.model.weight_bytes(),
                      platform=engine.platform_info, cross_encoder=engine.cross_encoder, vocab_size=engine.vocab_size,
                      pooling=engine.pooler_config is not None)


@dataclass
class EngineSnapshot:
    """The engine's counters and gauges after one iteration, for /metrics."""

    stats: EngineStats
    num_running: int
    num_waiting: int
    kv_usage: float
    engine: int = 0  # which data-parallel replica it describes
    max_loras: int = 0  # LoRA slots (0: LoRA off)
    lora_waiting: list[str] = field(default_factory=list)  # adapter names of the waiting requests
    lora_running: list[str] = field(default_factory=list)  # adapter names of the running requests


@dataclass
class IterationMessage:
    """Everything one loop iteration has to say, in one message."""

    accepted: list[tuple[str, Exception | None]] = field(default_factory=list)  # add -> None or its ValueError
    outputs: list[OutputDelta] = field(default_factory=list)  # what each request gained this step
    aborted: list[str] = field(default_factory=list)  # request ids aborted this iteration
    failed: list[str] = field(default_factory=list)  # request ids ended by ``error``
    error: EngineError | None = None  # why ``failed`` ended, or (with ``stopped``) why the loop ended
    snapshot: EngineSnapshot | None = None
    stopped: bool = False  # the loop has ended; nothing follows


def snapshot(engine: LLMEngine) -> EngineSnapshot:
    """The live stats object: sending it to a process copies it; ThreadCore copies it itself."""
    snap = EngineSnapshot(engine.stats, len(engine.scheduler.running), len(engine.scheduler.waiting),
                          engine.kv_cache.usage)
    if engine.config.enable_lora:
        snap.max_loras = engine.config.max_loras
        snap.lora_waiting, snap.lora_running = engine.scheduler.lora_adapters()
    return snap


def run_core_loop(engine: LLMEngine, inbox: Inbox, emit: Callable[[IterationMessage], None]) -> None:
    """Sleeps while there is no work; otherwise applies the queued ops and steps, one message each."""
    with torch.inference_mode():  # once for the whole loop, as run_until_finished: not by the worker each step
        _loop(engine, inbox, emit)


def _loop(engine: LLMEngine, inbox: Inbox, emit: Callable[[IterationMessage], None]) -> None:
    deltas = DeltaEncoder()
    while True:
        message = IterationMessage()
        stopping = _apply(engine, inbox(not engine.has_unfinished_requests()), message)
        if stopping:
            _fail_all(engine, EngineShutdownError("the server is shutting down"), message)
            message.stopped = True
        elif engine.has_unfinished_requests():
            try:
                message.outputs = [deltas.encode(output) for output in engine.step()]
            except RankFailedError:  # a tensor-parallel rank is gone: no later step can run
                raise
            except Exception:  # outside any one request's work: end them all, keep serving
                logger.exception("engine step failed outside any one request; ending all requests")
                _fail_all(engine, EngineError("the engine step failed; see the server log"), message)
        for request_id in message.aborted + message.failed:
            deltas.forget(request_id)
        message.snapshot = snapshot(engine)
        emit(message)
        if stopping:
            return


def _apply(engine: LLMEngine, ops: list[Op], message: IterationMessage) -> bool:
    """Applies adds and aborts in order; returns whether a stop was asked for."""
    stopping = False
    for op in ops:
        if isinstance(op, StopOp):
            stopping = True
        elif isinstance(op, AbortOp):
            engine.abort_request(op.request_id)
            message.aborted.append(op.request_id)
        elif isinstance(op, LoRAOp):
            try:
                if op.load:
                    engine.add_lora(op.lora_request)
                else:
                    engine.remove_lora(op.lora_request.lora_int_id)
                message.accepted.append((op.op_id, None))
            except ValueError as err:
                message.accepted.append((op.op_id, err))
        else:
            try:
                engine.add_requests(op.prompts, op.params, op.request_ids, op.arrival_time,
                                    priority=op.priority, user=op.user, lora_request=op.lora_request)
                error = None
            except ValueError as err:
                error = err
            message.accepted.extend((request_id, error) for request_id in op.request_ids)
    return stopping


def _fail_all(engine: LLMEngine, error: EngineError, message: IterationMessage) -> None:
    for request_id in list(engine.groups):
        engine.abort_request(request_id)
        message.failed.append(request_id)
    message.error = error
