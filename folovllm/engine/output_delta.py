"""Outputs cross from the engine core to the server as deltas, and become cumulative again there.

A RequestOutput holds everything generated so far, so sending one per request per step would cost
O(length) each step (O(length²) per request) in pickling alone. The core sends only what is new
(``DeltaEncoder``); the server rebuilds the cumulative RequestOutput its streams expect
(``DeltaDecoder``). Text can also shrink at the end (a stop string is cut off), so a text delta says
how many characters of the previous text stay before the new suffix.
"""
from __future__ import annotations

from dataclasses import dataclass

from folovllm.outputs import CompletionOutput, PromptLogprobs, RequestMetrics, RequestOutput, SampleLogprobs


@dataclass
class SampleDelta:
    index: int
    new_token_ids: list[int]
    text_keep: int  # characters of the previous text that stay; text_suffix follows them
    text_suffix: str
    new_logprobs: SampleLogprobs | None
    cumulative_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass
class OutputDelta:
    request_id: str
    samples: list[SampleDelta]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None  # the first delta of a request only
    prompt_logprobs: PromptLogprobs | None = None  # likewise (complete by a request's first output)
    kv_transfer_params: dict | None = None  # set on the finished delta of a producer's request
    num_external_computed_tokens: int = 0
    pooled: list | None = None  # a pooling request's result, on its finished delta


class DeltaEncoder:
    """Core side: remembers how much of each request it has sent."""

    def __init__(self) -> None:
        self._sent: dict[str, list[tuple[int, int, int]]] = {}  # per sample: tokens, text chars, logprobs

    def encode(self, output: RequestOutput) -> OutputDelta:
        first = output.request_id not in self._sent
        sent = self._sent.setdefault(output.request_id, [(0, 0, 0)] * len(output.outputs))
        samples = []
        for i, c in enumerate(output.outputs):
            num_tokens, num_chars, num_logprobs = sent[i]
            keep = min(num_chars, len(c.text))
            samples.append(SampleDelta(
                c.index, c.token_ids[num_tokens:], keep, c.text[keep:],
                c.logprobs[num_logprobs:] if c.logprobs is not None else None,
                c.cumulative_logprob, c.finish_reason, c.stop_reason))
            sent[i] = (len(c.token_ids), len(c.text), len(c.logprobs) if c.logprobs is not None else 0)
        if output.finished:
            del self._sent[output.request_id]
        return OutputDelta(output.request_id, samples, output.finished, output.metrics,
                           output.num_cached_tokens, output.prompt if first else None,
                           output.prompt_token_ids if first else None,
                           output.prompt_logprobs if first else None, output.kv_transfer_params,
                           output.num_external_computed_tokens, output.pooled)

    def forget(self, request_id: str) -> None:
        """The request ended without a finished output (aborted)."""
        self._sent.pop(request_id, None)


class DeltaDecoder:
    """Server side: turns deltas back into cumulative RequestOutputs."""

    def __init__(self) -> None:
        self._last: dict[str, RequestOutput] = {}

    def decode(self, delta: OutputDelta) -> RequestOutput:
        previous = self._last.get(delta.request_id)
        if previous is None:
            previous = RequestOutput(delta.request_id, delta.prompt, delta.prompt_token_ids or [],
                                     [CompletionOutput(s.index, "", []) for s in delta.samples],
                                     False, delta.metrics, prompt_logprobs=delta.prompt_logprobs)
        outputs = []
        for old, s in zip(previous.outputs, delta.samples):
            logprobs = None
            if s.new_logprobs is not None:
                logprobs = (old.logprobs or []) + s.new_logprobs
            outputs.append(CompletionOutput(
                s.index, old.text[:s.text_keep] + s.text_suffix, old.token_ids + s.new_token_ids,
                s.cumulative_logprob, logprobs, s.finish_reason, s.stop_reason))
        output = RequestOutput(delta.request_id, previous.prompt, previous.prompt_token_ids, outputs,
                               delta.finished, delta.metrics, delta.num_cached_tokens,
                               previous.prompt_logprobs, delta.kv_transfer_params,
                               delta.num_external_computed_tokens, delta.pooled)
        if delta.finished:
            self._last.pop(delta.request_id, None)
        else:
            self._last[delta.request_id] = output
        return output

    def forget(self, request_id: str) -> None:
        self._last.pop(request_id, None)
