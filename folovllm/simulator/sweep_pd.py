"""``simulate sweep --pd-ratios``: which split of instances between a prefill pool and a decode pool
serves the most requests within the SLOs.

Per rate, policy and admission mode, and per ratio P:D:
- ``pd_fewest``: the fewest instances, at exactly that ratio (k·P prefill and k·D decode replicas), whose
  p99 TTFT and p99 TPOT meet the SLOs; a ``colocated`` row gives the same for plain replicas;
- ``pd_fixed`` (``--pd-instances N``): the ratio scaled to N instances (prefill = N·P/(P+D) rounded, each
  pool at least one), its goodput (the share of requests whose own TTFT and TPOT are within the SLOs,
  times the rate), and N colocated replicas alongside. ``best`` marks the split of highest goodput at
  each N; among equals, the one furthest inside the SLOs (lowest ``slo_load``)."""
from __future__ import annotations

from typing import Any

from folovllm.simulator.sweep_trials import Trials, describe, figures, slo_load, smallest_passing


def parse_ratios(text: str) -> list[tuple[int, int]]:
    """``"1:1,1:2,2:1"`` → [(1, 1), (1, 2), (2, 1)] (ValueError naming the bad item)."""
    ratios = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        p, sep, d = item.partition(":")
        try:
            ratio = (int(p), int(d))
        except ValueError:
            ratio = (0, 0)
        if not sep or min(ratio) < 1:
            raise ValueError(f"--pd-ratios takes P:D pairs of positive integers, e.g. 1:2,1:3; got {item!r}")
        ratios.append(ratio)
    if not ratios:
        raise ValueError(f"--pd-ratios needs at least one P:D pair, got {text!r}")
    return ratios


def parse_counts(text: str, flag: str) -> list[int]:
    """``"2,4,8"`` → [2, 4, 8]: positive instance counts for ``flag``."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated instance counts, e.g. 2,4,8; got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"{flag} needs positive instance counts, got {text!r}")
    return counts


def split_instances(total: int, ratio: tuple[int, int]) -> tuple[int, int]:
    """(prefill, decode) replicas: ``total`` split by ``ratio``, rounded half up, each pool at least one."""
    if total < 2:
        raise ValueError(f"a prefill/decode split needs at least 2 instances, got {total}")
    prefill = int(total * ratio[0] / (ratio[0] + ratio[1]) + 0.5)
    prefill = min(max(prefill, 1), total - 1)
    return prefill, total - prefill


def _label(ratio: tuple[int, int]) -> str:
    return f"{ratio[0]}:{ratio[1]}"


def _fewest(trials: Trials, key: dict[str, Any], ratios: list[tuple[int, int]], limit: int) -> list[dict[str, Any]]:
    rate, policy, admission = key["rate"], key["policy"], key["admission"]
    rows = []
    n, result = smallest_passing(lambda k: trials.run(rate, policy, admission, replicas=k), trials.meets, limit)
    rows.append({"kind": "pd_fewest", **key, "ratio": "colocated", "prefill": None, "decode": None,
                 "instances": n, **figures(result, rate)})
    for ratio in ratios:
        size = ratio[0] + ratio[1]
        k, result = smallest_passing(
            lambda k, r=ratio: trials.run(rate, policy, admission, pd=(k * r[0], k * r[1])), trials.meets,
            limit // size)
        rows.append({"kind": "pd_fewest", **key, "ratio": _label(ratio),
                     "prefill": k * ratio[0] if k else None, "decode": k * ratio[1] if k else None,
                     "instances": k * size if k else None, **figures(result, rate)})
    for row in rows:
        print(f"rate {rate:g}/s {policy}/{admission} {row['ratio']}: "
              + (f"{row['instances']} instances ({describe(row)})" if row["instances"]
                 else f"more than {limit} instances"))
    return rows


def _fixed(trials: Trials, key: dict[str, Any], ratios: list[tuple[int, int]], total: int) -> list[dict[str, Any]]:
    rate, policy, admission = key["rate"], key["policy"], key["admission"]
    colocated = trials.run(rate, policy, admission, replicas=total)
    rows = [{"kind": "pd_fixed", **key, "instances": total, "ratio": "colocated", "prefill": None, "decode": None,
             "meets_slos": trials.meets(colocated), "best": False, **figures(colocated, rate)}]
    for ratio in ratios:
        pd = split_instances(total, ratio)
        result = trials.run(rate, policy, admission, pd=pd)
        rows.append({"kind": "pd_fixed", **key, "instances": total, "ratio": _label(ratio), "prefill": pd[0],
                     "decode": pd[1], "meets_slos": trials.meets(result), "best": False, **figures(result, rate)})
    slos = (trials.args.slo_ttft_p99, trials.args.slo_tpot_p99)
    best = max(rows[1:], key=lambda r: (r["good_fraction"], -slo_load(r, *slos)))
    best["best"] = True
    for row in rows:
        shape = "colocated" if row["prefill"] is None else f"{row['prefill']}P+{row['decode']}D"
        print(f"rate {rate:g}/s {policy}/{admission} {total} instances, {row['ratio']} ({shape}): "
              f"{row['good_fraction']:.1%} good, {describe(row)}"
              + ("  <- best split" if row["best"] else ""))
    return rows


def run_pd_study(trials: Trials, rates: list[float], policies: list[str], admissions: list[str],
                 ratios: list[tuple[int, int]], totals: list[int], limit: int) -> list[dict[str, Any]]:
    """The ``pd_fewest`` rows and, per total in ``totals``, the ``pd_fixed`` rows (see the module doc)."""
    if any(total < 2 for total in totals):
        raise ValueError(f"--pd-instances: a prefill/decode split needs at least 2 instances, got {totals}")
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for policy in policies:
            for admission in admissions:
                key = {"rate": rate, "policy": policy, "admission": admission}
                rows += _fewest(trials, key, ratios, limit)
                for total in totals:
                    rows += _fixed(trials, key, ratios, total)
    return rows
