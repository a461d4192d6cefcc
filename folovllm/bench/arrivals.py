"""When requests arrive: the arrival processes of ``bench serve`` and the offline drivers (numpy only,
so the simulator draws the same arrivals without importing an HTTP client)."""
from __future__ import annotations

import math

import numpy as np


def poisson_arrivals(num: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of a Poisson process of ``rate`` requests/s; all at 0 if rate is inf."""
    if rate == float("inf"):
        return [0.0] * num
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=num)
    return list(np.cumsum(gaps) - gaps[0])


def arrival_offsets(num: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send offsets (s, the first at 0): all 0 for an infinite rate; else gaps with mean 1/rate drawn
    from a gamma with shape ``burstiness`` (1.0: exponential, i.e. Poisson; < 1 burstier; > 1 steadier)."""
    if not rate > 0:
        raise ValueError(f"request rate must be positive (or inf), got {rate}.")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}.")
    if burstiness == 1.0 or math.isinf(rate):
        return [float(t) for t in poisson_arrivals(num, rate, seed)]
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=num)
    return [float(t) for t in np.cumsum(gaps) - gaps[0]]


def parse_rates(text: str) -> list[float]:
    """``"1,2,4,inf"`` → [1.0, 2.0, 4.0, inf]."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sweep-rates takes comma-separated numbers (or inf), got {text!r}.") from None
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"--sweep-rates needs positive rates, got {text!r}.")
    return rates
