"""`make check-api`: schemathesis over a live server's /openapi.json, every check, bounded in examples and time.

The server runs a tiny random Llama (dummy weights, the default model's tokenizer and chat template) so that
each generated request costs milliseconds; its request limits are small for the same reason, and
/openapi.json states them. Exit status: schemathesis' (0: clean). The server's log is printed on failure.

    python scripts/check_api.py [--max-examples 20] [--max-time 240] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODEL_LEN = 96
LIMITS = ["--max-n", "4", "--max-prompts-per-request", "4", "--max-stop-strings", "4",
          "--max-stop-string-chars", "32"]


def tiny_model(folder: Path) -> int:
    """A 2-layer Llama config over the default model's tokenizer, loaded with dummy weights; its vocabulary."""
    from transformers import LlamaConfig

    from folovllm.bench.gpu_runs import save_tokenizer
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(default_model_path()))
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_MODEL_LEN,
                         eos_token_id=2, bos_token_id=1, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
    config.save_pretrained(folder)
    save_tokenizer(folder)
    return vocab


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    from folovllm.bench.serve_client import wait_for_health

    def running() -> None:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")

    if not wait_for_health(url, timeout_s, running):
        raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=20, help="test cases per operation and phase")
    parser.add_argument("--max-time", type=int, default=240, help="seconds for the whole run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-api-") as tmp:
        folder = Path(tmp)
        vocab = tiny_model(folder / "model")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = (folder / "server.log").open("w+")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        server = subprocess.Popen(
            [sys.executable, "-m", "folovllm.entrypoints.cli", "serve", str(folder / "model"), "--port", str(port),
             "--load-format", "dummy", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
             "--served-model-name", "tiny", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
             "--log-level", "warning", *LIMITS],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(url, server, 300)
            # the hooks read what they need to know of the server (scripts/check_api_hooks.py)
            hooks_env = {**env, "SCHEMATHESIS_HOOKS": "scripts.check_api_hooks",
                         "CHECK_API_SERVER": json.dumps({"vocab": vocab, "max_model_len": MAX_MODEL_LEN,
                                                         "max_sequences": 4, "model": "tiny"})}
            run = subprocess.run(
                [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--checks", "all",
                 "--max-examples", str(args.max_examples), "--max-time", str(args.max_time), "--seed", str(args.seed),
                 "--phases", "examples,coverage,fuzzing", "--workers", "1", "--request-timeout", "120",
                 "--max-response-time", "120", "--generation-allow-x00", "false", "--no-color",
                 "--suppress-health-check", "filter_too_much,too_slow", "--generation-database", "none"],
                cwd=ROOT, env=hooks_env)
            if run.returncode != 0:
                log.seek(0)
                print("---- the server's log ----\n" + log.read()[-20000:], file=sys.stderr)
            return run.returncode
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    sys.exit(main())
