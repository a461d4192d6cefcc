"""Bound linears tagged with the one op call they make, so a caller can make that call itself.

A linear bound for direct calls (``LinearBase.bound``) is a small function ``x -> op(x, *args)``. Where it
is exactly that (``bound_op_call`` builds it), it carries ``op_call = (op, args)``: the C++ layer chain
(``compilation/layer_chain.py``) reads it to call the same op with the same arguments without going through Python.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Bound = Callable[[torch.Tensor], torch.Tensor]


def bound_op_call(op: Any, *args: Any) -> Bound:
    """``x -> op(x, *args)``, marked with its op and arguments."""
    def call(x: torch.Tensor) -> torch.Tensor:
        return op(x, *args)
    call.op_call = (op, args)  # type: ignore[attr-defined]
    return call


def op_call_of(fn: Any) -> tuple[Any, tuple] | None:
    """(op, args) of a tagged bound linear; None for any other callable."""
    return getattr(fn, "op_call", None)
