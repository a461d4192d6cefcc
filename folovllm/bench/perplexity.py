"""``folovllm bench perplexity``: strided perplexity of a text through the engine's prompt logprobs.

The text is tokenized once; windows of ``--max-tokens-per-window`` tokens start every ``--stride``
tokens. Each window goes through the engine as a prompt with ``prompt_logprobs=0`` (one generated
token, unused), and only its tokens past the overlap with the previous window are scored, so every
token after the first is scored exactly once, with up to ``window - stride`` tokens of context before
it: the standard strided perplexity. The CLI couples to this module only through
``add_perplexity_args`` and ``run_perplexity``.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from folovllm.engine.args import add_engine_args, engine_config_from_args
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams

# With no --text-file: Python's own help topics (pydoc_data.topics, in every CPython install), in
# sorted topic order, cut to their first DEFAULT_TEXT_TOKENS tokens. The wording follows the Python
# version, so the JSON records it.
DEFAULT_TEXT_TOKENS = 20_000


@dataclass(frozen=True)
class Window:
    """One window of the text: tokens ``[begin, end)``, of which the last ``num_scored`` are scored
    (never the window's first: nothing in the window predicts it)."""

    begin: int
    end: int
    num_scored: int


@dataclass
class PerplexityResult:
    model: str
    quantization: str
    dtype: str
    kv_cache_dtype: str
    max_num_batched_tokens: int  # below the window: later chunks read earlier ones from the (quantized) KV cache
    text_file: str | None  # None: the default text (pydoc_data.topics)
    python_version: str  # the default text's wording depends on it
    num_text_tokens: int
    tokens_scored: int
    num_windows: int
    max_tokens_per_window: int
    stride: int
    nll: float  # summed over the scored tokens, in nats
    perplexity: float
    time_s: float
    tokens_per_s: float  # window tokens run through the model per second


def strided_windows(num_tokens: int, max_tokens_per_window: int, stride: int) -> list[Window]:
    """Windows of at most ``max_tokens_per_window`` tokens, starting every ``stride`` tokens, until
    one reaches the end; each scores the tokens that the previous one did not reach."""
    if max_tokens_per_window < 2:
        raise ValueError(f"--max-tokens-per-window must be at least 2, got {max_tokens_per_window}")
    if not 1 <= stride <= max_tokens_per_window:
        raise ValueError(f"--stride must be in [1, --max-tokens-per-window={max_tokens_per_window}], "
                         f"got {stride}")
    if num_tokens < 2:
        raise ValueError(f"the text has {num_tokens} token(s); perplexity needs at least 2")
    windows, previous_end = [], 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + max_tokens_per_window, num_tokens)
        # A window's first token has no context inside it: never scored (stride == window size).
        windows.append(Window(begin, end, min(end - previous_end, end - begin - 1)))
        previous_end = end
        if end == num_tokens:
            break
    return windows


def window_nll(output: RequestOutput, window: Window) -> float:
    """Negative log-likelihood of the window's scored tokens, from its prompt logprobs."""
    ids, entries = output.prompt_token_ids, output.prompt_logprobs
    if entries is None:
        raise RuntimeError("the engine returned no prompt logprobs")
    length = window.end - window.begin
    return -sum(entries[pos][ids[pos]].logprob for pos in range(length - window.num_scored, length))


def default_text() -> str:
    """Python's help topics (``pydoc_data.topics``), in sorted topic order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def perplexity_of_tokens(llm, token_ids: Sequence[int], max_tokens_per_window: int,
                         stride: int) -> tuple[float, int, int]:
    """(summed NLL, tokens scored, windows) of ``token_ids`` on ``llm`` (an ``LLM``)."""
    max_model_len = llm.llm_engine.max_model_len
    if max_tokens_per_window >= max_model_len:
        raise ValueError(f"--max-tokens-per-window={max_tokens_per_window} leaves no room for the one "
                         f"generated token: it must be below max_model_len={max_model_len}")
    windows = strided_windows(len(token_ids), max_tokens_per_window, stride)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    prompts = [list(token_ids[w.begin:w.end]) for w in windows]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    nll = sum(window_nll(output, window) for output, window in zip(outputs, windows))
    return nll, sum(w.num_scored for w in windows), len(windows)


def add_perplexity_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench perplexity`` options to ``parser`` and return it."""
    parser.add_argument("--text-file", default=None,
                        help="UTF-8 text to score (default: Python's pydoc_data.topics in sorted topic "
                             f"order, its first {DEFAULT_TEXT_TOKENS} tokens)")
    parser.add_argument("--max-text-tokens", type=int, default=None,
                        help="score only the text's first N tokens (default: all of a --text-file)")
    parser.add_argument("--max-tokens-per-window", type=int, default=1024,
                        help="tokens per window (below max_model_len)")
    parser.add_argument("--stride", type=int, default=512,
                        help="tokens between window starts; each window scores the tokens past the overlap")
    parser.add_argument("--output-json", default=None, help="write the result object here")
    add_engine_args(parser)  # --model, --dtype, --max-model-len, ...
    return parser


def run_perplexity(args: argparse.Namespace) -> PerplexityResult:
    """Tokenizes the text, scores it window by window, prints ``perplexity: X`` and writes the JSON."""
    from folovllm import LLM  # the engine is heavy: `--help` stays free of it

    config = engine_config_from_args(args)
    if args.text_file is not None:
        with open(args.text_file, encoding="utf-8") as f:
            text = f.read()
        limit = args.max_text_tokens
    else:
        text, limit = default_text(), args.max_text_tokens or DEFAULT_TEXT_TOKENS
    if limit is not None and limit < 2:
        raise ValueError(f"--max-text-tokens must be at least 2, got {limit}")
    llm = LLM(**vars(config))
    token_ids = llm.get_tokenizer().encode(text)[:limit]
    start = time.perf_counter()
    nll, scored, num_windows = perplexity_of_tokens(llm, token_ids, args.max_tokens_per_window, args.stride)
    elapsed = time.perf_counter() - start
    windows = strided_windows(len(token_ids), args.max_tokens_per_window, args.stride)
    result = PerplexityResult(
        model=llm.model_path, quantization=config.quantization,
        dtype=str(llm.llm_engine.config.torch_dtype).removeprefix("torch."), kv_cache_dtype=config.kv_cache_dtype,
        max_num_batched_tokens=config.max_num_batched_tokens, text_file=args.text_file,
        python_version=platform.python_version(), num_text_tokens=len(token_ids), tokens_scored=scored,
        num_windows=num_windows, max_tokens_per_window=args.max_tokens_per_window, stride=args.stride,
        nll=nll, perplexity=math.exp(nll / scored), time_s=elapsed,
        tokens_per_s=sum(w.end - w.begin for w in windows) / elapsed if elapsed > 0 else 0.0)
    print(f"{scored} tokens scored in {num_windows} windows, {elapsed:.1f} s")
    print(f"perplexity: {result.perplexity:.4f}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(asdict(result), f, indent=2)
        print(f"wrote {args.output_json}")
    return result
