"""The name -> implementation registries behind attention backends, policies and admission modes."""
from __future__ import annotations

import pytest

from folovllm.core.admission import (
    ADMISSION_MODES,
    ReserveAdmission,
    admission_mode_names,
)
from folovllm.core.policy import FairSharePolicy, make_policy, policy_names
from folovllm.registry import Registry


def test_register_and_look_up() -> None:
    things: Registry[type] = Registry("thing")

    @things.register("b")
    class B: ...

    @things.register("a")
    class A: ...

    assert things.get("a") is A and things.names() == ["b", "a"]
    with pytest.raises(ValueError, match=r"unknown thing 'c'; supported: \['a', 'b'\]"):
        things.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        things.register("a")(B)


def test_builtin_policies_and_admission_modes_are_registered() -> None:
    assert policy_names() == ["fcfs", "priority", "sjf", "fair"]
    assert admission_mode_names() == ["on-demand", "reserve", "adaptive"]
    assert ADMISSION_MODES.get("reserve") is ReserveAdmission
    fair = make_policy("fair", 2.0, {"a": 2.0})
    assert isinstance(fair, FairSharePolicy) and fair.weights == {"a": 2.0} and fair.max_queue_delay == 2.0
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'"):
        make_policy("lifo")
