"""The engine-core loop steps its engine under inference mode, entered once for the loop."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from folovllm.engine.core_loop import StopOp, run_core_loop
from folovllm.engine.stats import EngineStats


class OneStepEngine:
    """Has work for one step; records whether each step ran in inference mode."""

    def __init__(self) -> None:
        self.modes: list[bool] = []
        self.groups: dict = {}
        self.stats = EngineStats()
        self.scheduler = SimpleNamespace(running=[], waiting=[])
        self.kv_cache = SimpleNamespace(usage=0.0)
        self.config = SimpleNamespace(enable_lora=False)

    def has_unfinished_requests(self) -> bool:
        return not self.modes

    def step(self) -> list:
        self.modes.append(torch.is_inference_mode_enabled())
        return []


def test_steps_run_in_inference_mode() -> None:
    engine, messages = OneStepEngine(), []
    run_core_loop(engine, lambda idle: [StopOp()] if engine.modes else [], messages.append)
    assert engine.modes == [True] and messages[-1].stopped
    assert not torch.is_inference_mode_enabled()
