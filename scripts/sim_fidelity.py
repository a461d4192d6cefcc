"""The simulator against the real server on three workloads the CPU profile was not fitted on.

    .venv/bin/python scripts/sim_fidelity.py            # full: 3 workloads x 3 live repeats, ~8 min quiet
    .venv/bin/python scripts/sim_fidelity.py --smoke    # a few requests each, to check the plumbing
    .venv/bin/python scripts/sim_fidelity.py --reuse-real /tmp/sim-fidelity-XXXX   # a new profile, same live runs

Per live repeat (``--live-repeats``, a fresh server each, so no repeat finds an earlier one's prompts
in the prefix cache): starts `folovllm serve --trace` (the CPU profile's model and max_model_len) and
runs `folovllm bench serve` for each workload. Then `folovllm simulate run` with the same options and
the CPU profile, and writes throughput, median TTFT and median TPOT, simulated vs the median of the
live repeats (their min-max beside it), with the relative error, to docs/results/sim-fidelity.json.
It also prices each live step the server traced during a workload with the profile and reports the
summed predicted / traced step time by prefill size (which steps the cost model misprices).
Workloads: a Poisson stream of mixed lengths, a burst, and a shared-prefix multi-turn stream (JSONL
with arrival times, so both sides replay the same trace).

Machine speed: the decode speed of this shared machine moved by 15-20 % between the calibration and the
live runs minutes later (one-row decode steps 7.0 ms against 6.0, the prefill steps alike in both), more
than the 15 % bar leaves. So each repeat runs a fixed probe (folovllm/simulator/speed.py: three lone
512-token prompts decoding 32 tokens each) before each workload and after the last, as
scripts/sim_calibrate.py does along the calibration; a workload's probes (before and after it) over the
calibration's give a decode and a prefill factor, and the simulator runs once per repeat with the
profile's terms scaled by that repeat's factors; the median of those runs is the simulator at the live
speed. That normalises the machine's speed, measured apart from the workload; it is not fitted on the
workload's steps. Both comparisons are printed and kept (``sim_at_calibration_speed``,
``sim_at_live_speed``); the headline (``sim``, ``rel_error``) is the profile as fitted unless
``--machine-speed``.

The burst's median TTFT is the end of its second ~0.6 s prefill step: about a second of machine time,
where the other workloads average over 40 s. The speed of this shared 2-core machine drifts by 20-30 %
over seconds, so one burst run measures the moment more than the engine; each live repeat therefore
runs the burst ``--burst-runs`` times, with seeds 12, 13, ...: fixed lengths and all requests at once
make every seed the same steps (only the token ids differ, so no run finds another's prompts cached),
and the simulator's single run stands for all of them.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from folovllm.simulator.calibrate import format_buckets, price_steps
from folovllm.simulator.cost_model import load_linear_profile
from folovllm.simulator.live import (
    CLI,
    PROFILE,
    send_probe,
    start_server,
    steps_between,
    threads_args,
)
from folovllm.simulator.speed import combine, probe_of, scaled, speed_factors

ROOT = Path(__file__).resolve().parent.parent


def workloads(smoke: bool, folder: Path) -> dict[str, list[str]]:
    n = 8 if smoke else 48
    return {
        "poisson-mixed": ["--dataset", "random", "--input-len-range", "16:768", "--output-len-range", "16:128",
                          "--request-rate", "1.5", "--num-prompts", str(n), "--seed", "11"],
        "burst": ["--dataset", "random", "--input-len", "256", "--output-len", "64", "--request-rate", "inf",
                  "--num-prompts", str(n // 2), "--seed", "12"],
        "multi-turn": ["--dataset", "jsonl", "--dataset-path", str(multi_turn_jsonl(folder / "mt.jsonl", n))],
    }


def multi_turn_jsonl(path: Path, num: int, turns: int = 4) -> Path:
    """Conversations sharing a 384-token system prompt; each turn resends the history (fake answers)."""
    rng = np.random.default_rng(13)
    ids = lambda k: [int(t) for t in rng.integers(1000, 30000, size=k)]  # noqa: E731
    system, lines = ids(384), []
    for c in range(max(1, num // turns)):
        history = list(system)
        for turn in range(turns):
            history += ids(24)
            lines.append({"prompt": list(history), "max_tokens": 32, "arrival_s": round(c * 1.0 + turn * 6.0, 3),
                          "ignore_eos": True})
            history += ids(32)
    lines.sort(key=lambda r: r["arrival_s"])
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def figures(result: dict) -> dict[str, float]:
    return {"output_tok_s": result["output_tok_s"], "median_ttft_ms": result["ttft_ms"]["p50"],
            "median_tpot_ms": result["tpot_ms"]["p50"] if result["tpot_ms"] else float("nan")}


def live_files(folder: Path, name: str) -> list[Path]:
    """The live runs of one workload in ``folder``: one per repeat (a single run in older folders)."""
    repeats = sorted(folder.glob(f"{name}-real-*.json"))
    return repeats or [p for p in [folder / f"{name}-real.json"] if p.is_file()]


def with_seed(argv: list[str], offset: int) -> list[str]:
    """``argv`` with its ``--seed`` moved by ``offset`` (``argv`` itself for 0)."""
    if offset == 0:
        return argv
    at = argv.index("--seed") + 1
    return [*argv[:at], str(int(argv[at]) + offset), *argv[at + 1:]]


def run_live(folder: Path, repeats: int, smoke: bool, max_model_len: int, serve_args: list[str],
             burst_runs: int = 1) -> None:
    """``repeats`` rounds of every workload (the burst ``burst_runs`` times, one seed each), each round
    against a fresh traced server; what each workload's window was in the trace (perf_counter, shared
    with the server on one machine)."""
    for repeat in range(repeats):
        trace = folder / f"steps-{repeat}.jsonl"
        proc, port = start_server(max_model_len, trace, serve_args)
        windows = {}
        try:
            for index, (name, argv) in enumerate(workloads(smoke, folder).items()):
                windows[f"probe-{index}"] = send_probe(port, 100 * repeat + index)
                print(f"live repeat {repeat + 1}/{repeats}: {name}", flush=True)
                started = time.perf_counter()
                for run in range(burst_runs if name == "burst" else 1):
                    stem = f"{name}-real-{repeat}" + (f".{run}" if run else "")
                    run_started = time.perf_counter()
                    subprocess.run([*CLI, "bench", "serve", "--port", str(port), "--no-progress", "--output-json",
                                    str(folder / f"{stem}.json"), *with_seed(argv, run)], cwd=ROOT,
                                   check=True, stdout=subprocess.DEVNULL)
                    windows[stem] = [run_started, time.perf_counter()]
                windows[name] = [started, time.perf_counter()]
            windows[f"probe-{index + 1}"] = send_probe(port, 100 * repeat + index + 1)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        (folder / f"windows-{repeat}.json").write_text(json.dumps(windows) + "\n")


def steps_within(windows_path: Path, key: str) -> list[dict]:
    """The traced steps of the window ``key`` (a workload, or one live run's file stem) in a repeat."""
    start, end = json.loads(windows_path.read_text()).get(key, [0.0, -1.0])
    return steps_between(trace_of(windows_path), start, end)


def trace_of(windows_path: Path) -> Path:
    """The step trace of the repeat whose windows ``windows_path`` holds."""
    return windows_path.with_name(windows_path.name.replace("windows-", "steps-").replace(".json", ".jsonl"))


def live_steps(folder: Path, name: str) -> list[dict]:
    """The traced steps of workload ``name`` over every repeat (none for folders without traces)."""
    return [step for path in sorted(folder.glob("windows-*.json")) for step in steps_within(path, name)]


def run_speed(model, real_json: Path) -> float | None:
    """One live run's traced step time over what the profile prices those steps at: above 1, the machine
    ran that workload slower than the profile's calibration did (None without its trace)."""
    name, label = real_json.stem.rsplit("-real-", 1)
    windows_path = real_json.with_name(f"windows-{label.split('.')[0]}.json")
    if not windows_path.is_file():
        return None
    key = real_json.stem if real_json.stem in json.loads(windows_path.read_text()) else name
    steps = steps_within(windows_path, key)
    check = price_steps(model, steps) if steps else None
    return check["measured_s"] / check["predicted_s"] if check and check["predicted_s"] > 0 else None


def workload_speed(folder: Path, index: int, calibration: dict[str, float]) -> list[dict[str, float]]:
    """Per live repeat, the machine-speed factors (folovllm/simulator/speed.py) of the workload ``index``: its
    probes just before and after it, against the profile's ``calibration`` probe. Empty without probes."""
    factors = []
    for path in sorted(folder.glob("windows-*.json")):
        keys = [f"probe-{index}", f"probe-{index + 1}"]
        if not calibration or not all(k in json.loads(path.read_text()) for k in keys):
            continue
        factors.append(speed_factors(combine([probe_of(steps_within(path, k)) for k in keys]), calibration))
    return factors


def simulate(profile_path: Path, argv: list[str], api: list[str], out: Path) -> dict[str, float]:
    subprocess.run([*CLI, "simulate", "run", "--profile", str(profile_path), "--output-json", str(out),
                    *api, *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return figures(json.loads(out.read_text())[0])


def relative(sim: dict[str, float], real: dict[str, float]) -> dict[str, float | None]:
    return {k: (sim[k] - real[k]) / real[k] if real[k] else None for k in real}


def row_for(name: str, argv: list[str], live: list[dict[str, float]], sim: dict[str, float],
            step_check: dict | None) -> dict:
    real = {k: float(np.median([run[k] for run in live])) for k in sim}
    return {"workload": name, "args": argv, "real": real, "sim": sim, "live_repeats": len(live),
            "real_runs": live, "real_spread": {k: [min(run[k] for run in live), max(run[k] for run in live)]
                                               for k in sim},
            "rel_error": relative(sim, real),
            "steps": step_check}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few requests per workload")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "sim-fidelity.json"))
    parser.add_argument("--profile", default=str(PROFILE), help="the CPU profile (simulate calibrate's output)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="the server's --num-threads (default: its own); fit the profile with the same")
    parser.add_argument("--api-server-ms", type=float, default=None,
                        help="the simulator's --api-server-ms (default: the profile's api_server_s)")
    parser.add_argument("--api-server-burst-ms", type=float, default=None,
                        help="the simulator's --api-server-burst-ms (default: the profile's api_server_burst_s)")
    parser.add_argument("--live-repeats", type=int, default=3,
                        help="live runs per workload, each round against a fresh server; the simulator is "
                             "compared with their median")
    parser.add_argument("--burst-runs", type=int, default=3,
                        help="burst runs per live repeat (seeds 12, 13, ...; the same steps): the burst's "
                             "figures hang on a second of machine time, so it takes more runs for a stable median")
    parser.add_argument("--machine-speed", action="store_true",
                        help="compare with the simulator at the machine speed the live runs' probes measured "
                             "(folovllm/simulator/speed.py) instead of the profile as fitted; both are printed and "
                             "kept whenever the profile and the live runs have probes")
    parser.add_argument("--reuse-real", metavar="DIR", default=None,
                        help="take the live runs from an earlier run's folder (printed at its end) instead of "
                             "starting a server: to compare another profile against the same measurements")
    args = parser.parse_args()
    if not Path(args.profile).is_file():
        raise SystemExit(f"{args.profile} is missing: fit it first (docs/simulator.md, 'Cost models')")
    profile_path = Path(args.profile)
    profile = json.loads(profile_path.read_text())
    folder = Path(args.reuse_real) if args.reuse_real else Path(tempfile.mkdtemp(prefix="sim-fidelity-"))
    if not args.reuse_real:
        run_live(folder, args.live_repeats, args.smoke, int(profile["defaults"]["max_model_len"]),
                 threads_args(args.num_threads), args.burst_runs)
    model = load_linear_profile(profile_path)
    if args.machine_speed and not model.speed_probe:
        raise SystemExit(f"--machine-speed: {profile_path.name} has no machine-speed probe (fitted before it "
                         "existed); fit it again with scripts/sim_calibrate.py")
    if not model.speed_probe:
        print(f"{profile_path.name} has no machine-speed probe (fitted before it existed): no comparison at the "
              "live runs' speed; scripts/sim_calibrate.py records one", flush=True)
    rows = []
    for index, (name, argv) in enumerate(workloads(args.smoke, folder).items()):
        real_jsons, sim_json = live_files(folder, name), folder / f"{name}-sim.json"
        if not real_jsons:
            raise SystemExit(f"{folder} has no live runs of {name}: --reuse-real takes the folder of an earlier "
                             "full run")
        api = [] if args.api_server_ms is None else ["--api-server-ms", str(args.api_server_ms)]
        if args.api_server_burst_ms is not None:
            api += ["--api-server-burst-ms", str(args.api_server_burst_ms)]
        sim = at_calibration = simulate(profile_path, argv, api, sim_json)
        factors = workload_speed(folder, index, model.speed_probe)
        if args.machine_speed and not factors:
            raise SystemExit(f"--machine-speed: {folder} has no probes around {name} (live runs from before "
                             "the probe existed)")
        if factors:  # one simulation per live repeat, at its probes' speed; compared by the median
            runs = []
            for repeat, factor in enumerate(factors):
                scaled_path = folder / f"{name}-profile-at-live-speed-{repeat}.json"
                scaled(model, factor).save(scaled_path)
                runs.append(simulate(scaled_path, argv, api, folder / f"{name}-sim-at-live-speed-{repeat}.json"))
            at_live = {k: float(np.median([run[k] for run in runs])) for k in at_calibration}
            sim = at_live if args.machine_speed else at_calibration
        live = [{**figures(json.loads(p.read_text())[0]), "traced_over_priced": run_speed(model, p)}
                for p in real_jsons]
        steps = live_steps(folder, name)
        row = row_for(name, argv, live, sim, price_steps(model, steps) if steps else None)
        row["sim_speed"] = "live" if factors and args.machine_speed else "calibration"
        if factors:
            median = {k: float(np.median([f[k] for f in factors])) for k in factors[0]}
            row.update(machine_speed=median, machine_speed_runs=factors, sim_runs_at_live_speed=runs,
                       sim_at_live_speed=at_live, rel_error_at_live_speed=relative(at_live, row["real"]),
                       sim_at_calibration_speed=at_calibration,
                       rel_error_at_calibration_speed=relative(at_calibration, row["real"]))
        rows.append(row)
    print(f"{'workload':<15}{'metric':<17}{'real':>10}{'live min-max':>16}{'sim':>10}{'error':>9}")
    for row in rows:
        for key in row["real"]:
            err = row["rel_error"][key]
            low, high = row["real_spread"][key]
            print(f"{row['workload']:<15}{key:<17}{row['real'][key]:>10.1f}{f'{low:.1f}-{high:.1f}':>16}"
                  f"{row['sim'][key]:>10.1f}{'n/a' if err is None else f'{err:+.0%}':>9}")
        if "machine_speed" in row:
            other = "calibration" if row["sim_speed"] == "live" else "live"
            speed, errors = row["machine_speed"], row[f"rel_error_at_{other}_speed"]
            print(f"  sim at the {row['sim_speed']} speed; the live probes' machine speed: decode "
                  f"x{speed['decode']:.3f}, prefill x{speed['prefill']:.3f} of the calibration's (median over the "
                  f"repeats; one simulation per repeat at its own); at the {other} speed: "
                  + ", ".join(f"{k} {v:+.0%}" for k, v in errors.items() if v is not None))
        if len(row["real_runs"]) > 1 and all(r["traced_over_priced"] for r in row["real_runs"]):
            print("  live runs, median TTFT ms (traced / priced step time): " + ", ".join(
                f"{r['median_ttft_ms']:.0f} ({r['traced_over_priced']:.2f})" for r in row["real_runs"]))
        if row["steps"]:
            check = row["steps"]
            total = check["predicted_s"] / check["measured_s"] - 1
            print(f"  {check['steps']} traced steps priced by the profile: {total:+.0%} in all; by prefill tokens "
                  f"per step: {format_buckets(check['by_prefill_tokens'])}")
    real_date = json.loads(live_files(folder, rows[0]["workload"])[0].read_text())[0].get("date")
    Path(args.out).write_text(json.dumps([{"name": "sim-fidelity", "smoke": args.smoke, "profile": profile_path.name,
                                           "fit": profile.get("fit", {}), "real_measured": real_date,
                                           "api_server_ms": (args.api_server_ms if args.api_server_ms is not None
                                                             else profile.get("api_server_s", 0.0) * 1e3),
                                           "api_server_burst_ms": (args.api_server_burst_ms
                                                                   if args.api_server_burst_ms is not None
                                                                   else profile.get("api_server_burst_s", 0.0) * 1e3),
                                           "rows": rows}], indent=2) + "\n")
    print(f"wrote {args.out}; the live runs are in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
