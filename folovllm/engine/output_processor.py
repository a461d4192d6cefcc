"""After each step: append sampled tokens, detokenize, apply stop rules, build RequestOutputs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from folovllm.detokenizer import IncrementalDetokenizer, find_stop
from folovllm.outputs import CompletionOutput, Logprob, RequestOutput
from folovllm.request import Request, RequestStatus


@dataclass
class RequestGroup:
    """The ``n`` samples of one user request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[Request]

    @property
    def finished(self) -> bool:
        return all(s.status.finished for s in self.samples)

    @property
    def final_only(self) -> bool:
        """Its caller reads only the final output (SamplingParams.output_kind)."""
        return self.samples[0].params.output_kind == "final_only"


class OutputProcessor:
    def __init__(self, tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._token_text: dict[int, str] = {}  # token id -> its text, for Logprob.decoded_token
        # every stop token of the requests started so far (a superset of the live ones' is enough to screen a
        # step's tokens), as a sorted array for numpy
        self._stop_ids: set[int] = set()
        self._stop_array = np.zeros(0, dtype=np.int64)

    def start(self, request: Request) -> None:
        request.output_limit = min(request.max_tokens, self.max_model_len - request.num_prompt_tokens)
        if not self._stop_ids.issuperset(request.stop_token_ids):
            self._stop_ids.update(request.stop_token_ids)
            self._stop_array = np.array(sorted(self._stop_ids), dtype=np.int64)
        if request.params.detokenize:  # detokenize=False: ids only, the tokenizer is never asked
            request.detokenizer = IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, request.params.skip_special_tokens)

    def stop_token_rows(self, requests: Sequence[Request], token_ids: list[int]) -> list[int]:
        """The rows whose token is one of its request's stop tokens (the whole step screened at once)."""
        if self._stop_ids.isdisjoint(token_ids):  # the common step: no stop token of anyone's among them
            return []
        screened = np.flatnonzero(np.isin(np.array(token_ids, dtype=np.int64), self._stop_array))
        return [row for row in screened.tolist() if token_ids[row] in requests[row].stop_token_ids]

    @staticmethod
    def detokenize(requests: Sequence[Request], token_ids: list[int],
                   stopped: list[int]) -> list[tuple[int, Exception]]:
        """Each row's token through its request's incremental detokenizer; a stop token's text is left out
        unless the request keeps special tokens (as ``append_token``). Returns the rows whose detokenizer
        raised, with the error (the caller ends those requests alone)."""
        skipped = set(stopped)
        failed: list[tuple[int, Exception]] = []
        for row, request in enumerate(requests):
            detokenizer = request.detokenizer
            if detokenizer is None or (row in skipped and request.params.skip_special_tokens is not False):
                continue
            try:
                detokenizer.append(token_ids[row])
            except Exception as error:
                failed.append((row, error))
                continue
            request.text = detokenizer.text
        return failed

    def stopped_by_token(self, request: Request, token_id: int) -> None:
        """The request ends on a stop token: its stop reason, and the text it still holds back."""
        request.stop_reason = token_id if token_id in request.params.stop_token_ids else None
        self.flush_text(request)

    def append_token(self, request: Request, token_id: int, logprobs=None) -> RequestStatus | None:
        """Records one sampled token; returns the finish status if the request is now done."""
        request.append_output_token(token_id)
        if logprobs is not None and request.logprobs is not None:
            request.logprobs.append(self._to_logprob_dict(logprobs))
            request.cumulative_logprob += logprobs.logprob
        params = request.params
        stopped_by_token = token_id in request.stop_token_ids
        if request.detokenizer is not None and (not stopped_by_token or params.skip_special_tokens is False):
            delta = request.detokenizer.append(token_id)
            request.text = request.detokenizer.text
        else:
            delta = ""
        num_outputs = len(request.output_token_ids)  # known tokens: a pending one is not judged yet
        if num_outputs >= params.min_tokens:
            if stopped_by_token:
                self.stopped_by_token(request, token_id)
                return RequestStatus.FINISHED_STOPPED
            if params.stop and delta:
                cut = find_stop(request.text, len(delta), params.stop)
                if cut is not None:
                    request.stop_reason = next(s for s in params.stop if request.text.startswith(s, cut))
                    keep = cut + len(request.stop_reason) if params.include_stop_str_in_output else cut
                    request.text = request.text[:keep]
                    return RequestStatus.FINISHED_STOPPED
        if num_outputs >= request.max_tokens or len(request.token_ids) >= self.max_model_len:
            self.flush_text(request)  # a character cut off by the length limit
            return RequestStatus.FINISHED_LENGTH
        return None

    @staticmethod
    def flush_text(request: Request) -> None:
        """The text the request's detokenizer holds back (an incomplete character), now that it ends."""
        if request.detokenizer is not None:
            request.detokenizer.finish()
            request.text = request.detokenizer.text

    def add_prompt_logprobs(self, request: Request, first_position: int, entries: list) -> None:
        """Records the logprobs of prompt positions ``first_position...``; a recomputed position
        (after preemption) is overwritten, so nothing is counted twice."""
        if request.prompt_logprobs is None:
            return
        for offset, token_logprobs in enumerate(entries):
            request.prompt_logprobs[first_position + offset] = self._to_logprob_dict(token_logprobs)
        request.num_prompt_logprobs = max(request.num_prompt_logprobs, first_position + len(entries) - 1)

    def token_text(self, token_id: int) -> str:
        """The token as text (``" Paris"``, not the vocabulary's ``"ĠParis"``), cached per id."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _to_logprob_dict(self, token_logprobs) -> dict[int, Logprob]:
        decode = self.token_text
        entries = {tid: Logprob(lp, rank + 1, decode(tid))
                   for rank, (tid, lp) in enumerate(token_logprobs.top_logprobs)}
        entries.setdefault(token_logprobs.token_id, Logprob(
            token_logprobs.logprob, token_logprobs.rank, decode(token_logprobs.token_id)))
        return entries

    @staticmethod
    def make_output(group: RequestGroup) -> RequestOutput:
        samples = group.samples
        outputs = [CompletionOutput(
            index=s.sample_index, text=s.text, token_ids=list(s.output_token_ids),
            cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
            logprobs=list(s.logprobs) if s.logprobs is not None else None,
            finish_reason=s.finish_reason, stop_reason=s.stop_reason) for s in samples]
        first = samples[0]
        metrics = replace(first.metrics)
        if len(samples) > 1:  # the group's first token is its earliest, its end the latest
            times = [s.metrics.first_token_time for s in samples if s.metrics.first_token_time]
            metrics.first_token_time = min(times) if times else None
            ends = [s.metrics.finished_time for s in samples]
            metrics.finished_time = max(ends) if all(ends) else None
        return RequestOutput(
            request_id=group.request_id, prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids, outputs=outputs, finished=group.finished,
            metrics=metrics, num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=None if first.needs_prompt_logprobs else first.prompt_logprobs,
            kv_transfer_params=first.kv_transfer_params_out,
            num_external_computed_tokens=first.num_external_computed_tokens, pooled=first.pooled)
