"""How long one engine step takes, from the step's shape: the cost model's interface, the linear model
(fitted by ``calibrate.py``) and device profiles as JSON files."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
LINEAR_TERMS = ("fixed_s", "per_prefill_token_s", "per_decode_row_s", "per_context_token_s", "per_request_s",
                "per_prefill_step_s", "per_prefill_token_context_s", "per_prefill_cached_pair_s",
                "per_prefill_new_pair_s", "per_prefill_token_below_knee_s")
# Terms added after the first profiles were written: a profile without them reads them as 0.
OPTIONAL_TERMS = ("per_prefill_step_s", "per_prefill_token_context_s", "per_prefill_cached_pair_s",
                  "per_prefill_new_pair_s", "per_prefill_token_below_knee_s")


@dataclass(frozen=True)
class StepShape:
    """What one step computes, as the cost models see it."""

    num_prefill_tokens: int  # tokens of prompts (or recomputed after preemption)
    num_decode_rows: int  # requests generating one token from a full cache
    context_tokens: int  # summed over the batch: cached + new tokens each request's attention reads
    num_requests: int  # batch size
    attention_pairs: int = 0  # (query, key) pairs the attention computes; the roofline's FLOPs term
    num_sampled: int = 0  # rows whose logits are computed (the LM head)
    # prefill chunks' new tokens × the tokens their request had computed before (a cached prefix, an
    # earlier chunk): the attention of new prompt tokens over K/V already in the cache
    prefill_cached_pairs: int = 0
    # prefill chunks' causal pairs among their own new tokens (n·(n + 1) / 2 for a chunk of n): the
    # attention of a fresh prompt over itself, which a few long prompts have more of than many short ones
    prefill_new_pairs: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_rows

    def features(self, knee: int = 0) -> list[float]:
        """The linear model's regressors, in ``LINEAR_TERMS`` order (``knee``: the prefill tokens up to
        which the below-knee term counts; 0 for none)."""
        prefill = float(self.num_prefill_tokens)
        return [1.0, prefill, float(self.num_decode_rows), float(self.context_tokens), float(self.num_requests),
                1.0 if prefill else 0.0, prefill * self.context_tokens, float(self.prefill_cached_pairs),
                float(self.prefill_new_pairs), min(prefill, float(knee))]


class CostModel(Protocol):
    """Seconds one step of ``shape`` takes on one replica."""

    name: str

    def step_time(self, shape: StepShape) -> float: ...


@dataclass
class LinearCostModel:
    """fixed + a·prefill tokens + b·decode rows + c·context tokens + d·requests + e·[the step prefills]
    + f·prefill tokens × context tokens + g·cached pairs + h·new pairs + k·min(prefill tokens, knee)
    (seconds). The f term stands for prefill attention, which grows with the tokens each prompt token
    attends to; the step's summed context is the trace's proxy for that. The g term is the attention of
    new prompt tokens over a prefix already in the cache (a prefix-cache hit, an earlier chunk), which an
    engine may run on another path than a fresh prompt's; h is the attention of new prompt tokens among
    themselves. k bends the prefill cost with the step's size: the first ``prefill_knee_tokens`` tokens of
    a step cost a + k each, the rest a (a matmul over more rows runs more efficiently per row).
    ``prefill_knee_tokens`` 0 leaves k out.

    ``min_step_s`` floors a prediction, since a fit may give a term a small negative weight."""

    name: str
    coefficients: dict[str, float]
    min_step_s: float = 1e-5
    fit: dict[str, Any] = field(default_factory=dict)  # how the profile was made and how well it fits
    defaults: dict[str, Any] = field(default_factory=dict)  # engine settings it was measured with
    # not a step cost: the API server's time per request before the engine has it (the cluster applies it)
    api_server_s: float = 0.0
    api_server_burst_s: float = 0.0  # the API server's time per request of a burst (sent at one instant)
    prefill_knee_tokens: int = 0  # where the below-knee prefill term stops counting (0: no such term)
    # the machine-speed probe measured when the trace was recorded (``speed.py``; empty: none), so that live
    # runs elsewhere or later can be compared at the same machine speed
    speed_probe: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [t for t in LINEAR_TERMS if t not in self.coefficients and t not in OPTIONAL_TERMS]
        if missing:
            raise ValueError(f"a linear profile needs coefficients {', '.join(LINEAR_TERMS)}; missing {missing}")
        self.coefficients = {t: float(self.coefficients.get(t, 0.0)) for t in LINEAR_TERMS}
        if self.prefill_knee_tokens <= 0 and self.coefficients["per_prefill_token_below_knee_s"]:
            raise ValueError("per_prefill_token_below_knee_s needs prefill_knee_tokens > 0")
        self._weights = list(self.coefficients.values())

    def step_time(self, shape: StepShape) -> float:
        w = self._weights
        prefill = shape.num_prefill_tokens
        t = (w[0] + w[1] * prefill + w[2] * shape.num_decode_rows + w[3] * shape.context_tokens
             + w[4] * shape.num_requests)
        if prefill:
            t += (w[5] + w[6] * prefill * shape.context_tokens + w[7] * shape.prefill_cached_pairs
                  + w[8] * shape.prefill_new_pairs + w[9] * min(prefill, self.prefill_knee_tokens))
        return t if t > self.min_step_s else self.min_step_s

    def to_json(self) -> dict[str, Any]:
        return {"kind": "linear", **asdict(self)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def load_linear_profile(path: str | Path) -> LinearCostModel:
    """A profile written by ``folovllm simulate calibrate`` (ValueError naming what is wrong)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read the cost profile {path}: {err}") from None
    if not isinstance(data, dict) or data.get("kind") != "linear":
        raise ValueError(f"{path} is not a linear cost profile (expected {{\"kind\": \"linear\", ...}})")
    data.pop("kind")
    return LinearCostModel(**data)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``folovllm/simulator/profiles/``."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
