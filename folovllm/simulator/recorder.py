"""What a simulated run observed of each request: arrival, first token, end, token counts and the gaps
between tokens, as a client streaming the response would have seen them (arrays, not objects)."""
from __future__ import annotations

from array import array

import numpy as np

from folovllm.request import Request


class Recorder:
    """Per-request timings by request index; inter-token gaps pooled (and per request when asked)."""

    def __init__(self, num_requests: int, keep_token_times: bool = False) -> None:
        self.arrival = np.zeros(num_requests)
        self.first_token = np.full(num_requests, np.nan)
        self.finished = np.full(num_requests, np.nan)
        self.prompt_len = np.zeros(num_requests, dtype=np.int64)
        self.output_len = np.zeros(num_requests, dtype=np.int64)
        self.errors: dict[int, str] = {}
        self.itl = array("d")
        self.token_times: list[list[float]] | None = (
            [[] for _ in range(num_requests)] if keep_token_times else None)

    def start(self, index: int, arrival: float, prompt_len: int) -> None:
        self.arrival[index] = arrival
        self.prompt_len[index] = prompt_len

    def fail(self, index: int, reason: str) -> None:
        self.errors[index] = reason
        self.finished[index] = self.arrival[index]

    def token(self, index: int, request: Request, now: float) -> None:
        """A token of request ``index`` reached the client at ``now`` (``request.metrics`` holds the last one)."""
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self.first_token[index] = now
        else:
            self.itl.append(now - metrics.last_token_time)
        metrics.last_token_time = now
        if self.token_times is not None:
            self.token_times[index].append(now)

    def finish(self, index: int, now: float, num_output_tokens: int) -> None:
        self.finished[index] = now
        self.output_len[index] = num_output_tokens

    @property
    def ok(self) -> np.ndarray:
        """Mask of the requests that finished without error."""
        mask = ~np.isnan(self.finished) & ~np.isnan(self.first_token)
        for index in self.errors:
            mask[index] = False
        return mask
