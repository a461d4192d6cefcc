"""Machine-speed normalisation for comparing a profile with live runs on a shared machine.

A fixed probe (a few lone fresh prompts of ``PROBE_PROMPT_LEN`` tokens, each decoding
``PROBE_OUTPUT_LEN`` tokens) is run on the server both when the profile is fitted and around each live
workload. Its one-row decode steps and its prefill steps, read from the server's step trace, say how
fast the machine ran at that moment. The ratio of the live probe to the calibration probe scales the
profile's terms: the decode factor the terms every step pays (fixed, decode rows, context, requests:
weight and KV reads, bound by memory), the prefill factor the prefill terms (bound by compute). It
corrects for the machine, measured apart from the workload; it is not fitted on the workload's own steps.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from folovllm.simulator.cost_model import LinearCostModel

PROBE_REQUESTS, PROBE_PROMPT_LEN, PROBE_OUTPUT_LEN = 3, 512, 32
# the terms the decode factor scales; every other term is a prefill term and takes the prefill factor
DECODE_TERMS = ("fixed_s", "per_decode_row_s", "per_context_token_s", "per_request_s")


def probe_of(steps: list[dict[str, Any]]) -> dict[str, float]:
    """The probe's figures from its traced steps: the median one-row decode step and the median prefill
    step of ``PROBE_PROMPT_LEN`` tokens alone (seconds). ValueError if the steps lack either."""
    decode = [s["duration_s"] for s in steps
              if s.get("num_scheduled") == 1 and s["num_prefill_tokens"] == 0 and s["num_decode_tokens"] == 1]
    prefill = [s["duration_s"] for s in steps
               if s.get("num_scheduled") == 1 and s["num_prefill_tokens"] == PROBE_PROMPT_LEN]
    if not decode or not prefill:
        raise ValueError(f"the probe's steps hold {len(decode)} one-row decode and {len(prefill)} "
                         f"{PROBE_PROMPT_LEN}-token prefill steps; it needs both")
    return {"decode_step_s": float(np.median(decode)), "prefill_step_s": float(np.median(prefill))}


def combine(probes: list[dict[str, float]]) -> dict[str, float]:
    """Several probes (before and after a workload, or along a calibration) as one: the mean of each figure."""
    if not probes:
        raise ValueError("no probes to combine")
    return {k: float(np.mean([p[k] for p in probes])) for k in probes[0]}


def speed_factors(live: dict[str, float], calibration: dict[str, float]) -> dict[str, float]:
    """How much slower (> 1) the machine ran during ``live`` than during the calibration, for decode and prefill."""
    return {"decode": live["decode_step_s"] / calibration["decode_step_s"],
            "prefill": live["prefill_step_s"] / calibration["prefill_step_s"]}


def scaled(model: LinearCostModel, factors: dict[str, float]) -> LinearCostModel:
    """``model`` with its decode terms times ``factors['decode']`` and its prefill terms times
    ``factors['prefill']``; the factors are kept in its ``fit`` (``machine_speed``)."""
    coefficients = {term: value * factors["decode" if term in DECODE_TERMS else "prefill"]
                    for term, value in model.coefficients.items()}
    return dataclasses.replace(model, coefficients=coefficients, fit={**model.fit, "machine_speed": dict(factors)})
