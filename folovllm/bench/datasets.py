"""Request sets for ``bench serve``: synthetic (random, the reference workloads, shared prefix, ShareGPT-like)
or read from a JSONL file.

Prompts. The client has no tokenizer, so token-length control comes from sending token-id lists to
/v1/completions (our server and vLLM accept them; ids are drawn from ``token_id_range``, clear of the
special tokens at the start of common vocabularies). /v1/chat/completions takes text, so chat prompts
are random common English words, about one token each, plus the chat template's tokens; the server's
usage (prompt_tokens) gives the exact count that the results report.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

PromptFormat = Literal["ids", "text"]
INF = float("inf")
DEFAULT_TOKEN_ID_RANGE = (1000, 30000)  # inside every vocabulary of ≥ 32k tokens, past the special ids

# Short, common words: byte-level BPE vocabularies hold each (with its leading space) as one token.
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city name team minute idea kid body back parent face others level office "
    "door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education foot boy age policy music market sense nation plan college "
    "interest death experience effect class control care field development role effort rate heart "
    "drug show leader light voice wife police mind price report decision son view town road"
).split()


@dataclass
class ServeRequest:
    """One benchmark request. ``prompt_len`` is the client's count (exact for token ids, words for text)."""

    prompt: str | list[int] | None  # None when ``messages`` carries the conversation
    max_tokens: int
    prompt_len: int
    messages: list[dict[str, Any]] | None = None
    tag: str = ""  # class for per-class breakdowns ("short" / "long"); "" when the set has none
    arrival_s: float | None = None  # offset from the run's start when the set fixes arrivals
    ignore_eos: bool = True  # synthetic sets fix their output lengths


@dataclass(frozen=True)
class SeedWorkload:
    """A reference serving workload at GPU scale (count, lengths, arrivals); lengths are inclusive ranges."""

    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    request_rate: float  # inf: burst
    long_input_len: int | None = None  # mixed: half the requests (tag "long") get this prompt length


SEED_WORKLOADS: dict[str, SeedWorkload] = {
    "warm-up": SeedWorkload(8, (11, 11), (8, 8), INF),
    "prefill-heavy": SeedWorkload(128, (1024, 1024), (16, 16), INF),
    "decode-heavy": SeedWorkload(128, (10, 10), (512, 512), INF),
    "l2": SeedWorkload(128, (10, 10), (256, 256), INF),  # the GPU reference compares burst with --request-rate 64
    "long-poisson": SeedWorkload(128, (1024, 1024), (256, 256), 64.0),
    "mixed": SeedWorkload(128, (10, 10), (256, 256), 64.0, long_input_len=1024),
    "nano-vllm": SeedWorkload(256, (100, 1024), (100, 1024), INF),
}
SYNTHETIC_DATASETS = ("random", "shared-prefix", "sharegpt-like")
DATASETS = SYNTHETIC_DATASETS + tuple(SEED_WORKLOADS) + ("jsonl",)
# ShareGPT-like length statistics: (mean, max) of input and output lengths, in tokens.
SHAREGPT_INPUT = (200, 2048)
SHAREGPT_OUTPUT = (150, 1024)
SHAREGPT_SIGMA = 1.0  # log-space spread of the lognormal lengths


def parse_len_range(text: str, name: str) -> tuple[int, int]:
    """``"a:b"`` → (a, b) with 1 ≤ a ≤ b."""
    lo, sep, hi = text.partition(":")
    try:
        bounds = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise ValueError(f"{name} must look like MIN:MAX with integers, got {text!r}.") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"{name} needs 1 <= MIN <= MAX, got {text!r}.")
    return bounds


class PromptMaker:
    """Random prompts of a given token length, as token ids or as words."""

    def __init__(self, fmt: PromptFormat, rng: np.random.Generator,
                 token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE) -> None:
        if fmt not in ("ids", "text"):
            raise ValueError(f"prompt format must be 'ids' or 'text', got {fmt!r}.")
        if not 0 <= token_id_range[0] < token_id_range[1]:
            raise ValueError(f"token id range must satisfy 0 <= MIN < MAX, got {token_id_range}.")
        self.fmt, self.rng, self.token_id_range = fmt, rng, token_id_range

    def make(self, length: int) -> str | list[int]:
        if self.fmt == "ids":
            return [int(t) for t in self.rng.integers(*self.token_id_range, size=length)]
        return " ".join(self.rng.choice(WORDS, size=length))

    def join(self, prefix: str | list[int], suffix: str | list[int]) -> str | list[int]:
        return prefix + " " + suffix if isinstance(prefix, str) else prefix + suffix


def _lengths(rng: np.random.Generator, n: int, bounds: tuple[int, int]) -> np.ndarray:
    return rng.integers(bounds[0], bounds[1], size=n, endpoint=True)


def random_dataset(num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                   maker: PromptMaker) -> list[ServeRequest]:
    """Prompt and output lengths uniform in the inclusive ranges (equal ends: fixed)."""
    ins, outs = _lengths(maker.rng, num_prompts, input_len), _lengths(maker.rng, num_prompts, output_len)
    return [ServeRequest(maker.make(int(i)), int(o), int(i)) for i, o in zip(ins, outs)]


def seed_workload(name: str, num_prompts: int | None, maker: PromptMaker,
                  input_len: tuple[int, int] | None = None,
                  output_len: tuple[int, int] | None = None) -> list[ServeRequest]:
    """A reference workload (``SEED_WORKLOADS``) with ``num_prompts`` requests (default: its count).

    ``input_len`` / ``output_len`` replace the table's lengths; for ``mixed``, ``input_len`` sets the
    long class (short prompts stay at the table's 10 tokens) and exactly half the requests are long.
    """
    spec = SEED_WORKLOADS[name]
    n = spec.num_requests if num_prompts is None else num_prompts
    outs = _lengths(maker.rng, n, output_len or spec.output_len)
    if spec.long_input_len is None:
        ins = _lengths(maker.rng, n, input_len or spec.input_len)
        tags = [""] * n
    else:
        long_len = input_len[1] if input_len else spec.long_input_len
        tags = list(maker.rng.permutation(["long"] * (n // 2) + ["short"] * (n - n // 2)))
        ins = [long_len if t == "long" else spec.input_len[0] for t in tags]
    return [ServeRequest(maker.make(int(i)), int(o), int(i), tag=str(t)) for i, o, t in zip(ins, outs, tags)]


def shared_prefix_dataset(num_prompts: int, prefix_len: int, suffix_len: tuple[int, int],
                          output_len: tuple[int, int], maker: PromptMaker) -> list[ServeRequest]:
    """One common ``prefix_len``-token prefix, then a distinct random suffix per request."""
    if prefix_len < 0:
        raise ValueError(f"prefix length must be >= 0, got {prefix_len}.")
    prefix = maker.make(prefix_len)
    requests = random_dataset(num_prompts, suffix_len, output_len, maker)
    for req in requests:
        req.prompt = maker.join(prefix, req.prompt) if prefix_len else req.prompt
        req.prompt_len += prefix_len
    return requests


def _clipped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ LogNormal(mu, sigma)."""
    phi = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
    log_cap = math.log(cap)
    return (math.exp(mu + sigma ** 2 / 2) * phi((log_cap - mu - sigma ** 2) / sigma)
            + cap * (1.0 - phi((log_cap - mu) / sigma)))


def clipped_lognormal_lengths(rng: np.random.Generator, n: int, mean: float, cap: int,
                              sigma: float = SHAREGPT_SIGMA) -> np.ndarray:
    """Integer lengths in [1, cap] from a lognormal whose mu is solved so the clipped mean is ``mean``."""
    lo, hi = -10.0, math.log(cap) + 10.0
    for _ in range(100):  # bisection: the clipped mean grows with mu
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _clipped_lognormal_mean(mid, sigma, cap) < mean else (lo, mid)
    samples = rng.lognormal((lo + hi) / 2, sigma, size=n)
    return np.clip(np.rint(samples), 1, cap).astype(np.int64)


def sharegpt_like_dataset(num_prompts: int, maker: PromptMaker,
                          max_model_len: int | None = None) -> list[ServeRequest]:
    """Synthetic lengths with ShareGPT's statistics (input mean 200 max 2048, output mean 150 max 1024).

    With ``max_model_len``, a request that would not fit is shortened: prompt first to leave one token
    of output, then output to the space left.
    """
    ins = clipped_lognormal_lengths(maker.rng, num_prompts, *SHAREGPT_INPUT)
    outs = clipped_lognormal_lengths(maker.rng, num_prompts, *SHAREGPT_OUTPUT)
    if max_model_len is not None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {max_model_len}.")
        ins = np.minimum(ins, max_model_len - 1)
        outs = np.minimum(outs, max_model_len - ins)
    return [ServeRequest(maker.make(int(i)), int(o), int(i)) for i, o in zip(ins, outs)]


def _jsonl_request(record: Any) -> ServeRequest:
    """One JSONL record → request; ValueError says what is wrong (the caller adds the line)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if ("prompt" in record) == ("messages" in record):
        raise ValueError("give exactly one of 'prompt' or 'messages'")
    prompt, messages = record.get("prompt"), record.get("messages")
    if "prompt" in record:
        is_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                 for t in prompt)
        if not (isinstance(prompt, str) or is_ids) or not prompt:
            raise ValueError("'prompt' must be a non-empty string or a non-empty list of token ids (ints >= 0)")
        prompt_len = len(prompt) if is_ids else len(prompt.split())
    else:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ValueError("'messages' must be a non-empty list of {\"role\": str, \"content\": str}")
        prompt_len = sum(len(m["content"].split()) for m in messages)
    max_tokens = record.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
    arrival = record.get("arrival_s")
    if arrival is not None and (not isinstance(arrival, (int, float)) or isinstance(arrival, bool)
                                or not 0 <= arrival < INF):
        raise ValueError(f"'arrival_s' must be a number >= 0, got {arrival!r}")
    tag, ignore_eos = record.get("class", ""), record.get("ignore_eos", False)
    if not isinstance(tag, str) or not isinstance(ignore_eos, bool):
        raise ValueError("'class' must be a string and 'ignore_eos' a boolean")
    return ServeRequest(prompt, max_tokens, prompt_len, messages=messages, tag=tag,
                        arrival_s=None if arrival is None else float(arrival), ignore_eos=ignore_eos)


def load_jsonl(path: str | Path, num_prompts: int | None = None) -> list[ServeRequest]:
    """Requests from a JSONL file: one {"prompt" | "messages", "max_tokens", "arrival_s"?, "class"?,
    "ignore_eos"?} per line (blank lines skipped); the first ``num_prompts`` when given.

    Raises ValueError naming the line and what is wrong; ``arrival_s`` must be on every line or none.
    """
    requests: list[ServeRequest] = []
    with_arrival: bool | None = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if num_prompts is not None and len(requests) >= num_prompts:
                break
            if not line.strip():
                continue
            try:
                req = _jsonl_request(json.loads(line))
                if with_arrival is None:
                    with_arrival = req.arrival_s is not None
                elif with_arrival != (req.arrival_s is not None):
                    raise ValueError("'arrival_s' must be given on every line or on none")
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: {err}") from None
            requests.append(req)
    if not requests:
        raise ValueError(f"{path}: no requests in the file.")
    return requests


def adapt_to_endpoint(requests: list[ServeRequest], endpoint: str) -> list[ServeRequest]:
    """Chat turns text prompts into one user message; completions and embeddings cannot take messages,
    chat no ids."""
    for i, req in enumerate(requests):
        if endpoint in ("completions", "embeddings") and req.messages is not None:
            raise ValueError(f"request {i + 1} has 'messages': use --endpoint chat for it.")
        if endpoint == "chat" and isinstance(req.prompt, list):
            raise ValueError(f"request {i + 1} has a token-id prompt: chat takes text; use --endpoint completions.")
        if endpoint == "chat" and req.messages is None:
            req.messages, req.prompt = [{"role": "user", "content": req.prompt}], None
    return requests


def default_request_rate(dataset: str) -> float:
    """The arrival rate a dataset implies: the table's for seed workloads, burst for the rest."""
    return SEED_WORKLOADS[dataset].request_rate if dataset in SEED_WORKLOADS else INF
