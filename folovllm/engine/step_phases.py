"""Where the host's time in the engine's steps goes, summed by phase (``folovllm bench host`` reads it).

Each ``lap(phase)`` charges the time since the previous lap (or ``start``) to ``phase``: a step is a row of
laps, so the phases add up to the step's host time and a lap costs one clock read. The worker measures
its own parts of a launch (the batch's tensors, sampling: ``LaunchedStep.times``); the engine charges the
rest of the launch to ``launch``. On an asynchronous device the launch phases are the host's work to queue
the step, not the device's.
"""
from __future__ import annotations

import time

PHASES = ("schedule", "input build", "launch", "sampling", "output processing", "stop checks", "detokenize")


class PhaseClock:
    """Host seconds per phase, summed over steps (``seconds``); ``steps`` counts ``start`` calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._last = time.perf_counter()

    def start(self) -> None:
        """A step begins: time before it is nobody's."""
        self.steps += 1
        self._last = time.perf_counter()

    def lap(self, phase: str, waited_s: float = 0.0) -> None:
        """The time since the last lap to ``phase``, less ``waited_s`` spent waiting for the device."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._last - waited_s
        self._last = now

    def lap_launch(self, input_build_s: float, sampling_s: float) -> None:
        """A worker's launch just returned: the parts it timed to their phases, the rest to ``launch``."""
        now = time.perf_counter()
        seconds = self.seconds
        seconds["input build"] += input_build_s
        seconds["sampling"] += sampling_s
        seconds["launch"] += now - self._last - input_build_s - sampling_s
        self._last = now

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)
