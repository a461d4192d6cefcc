"""Checks and truncation a prompt goes through before it becomes a request (the engine and the server share them)."""
from __future__ import annotations

from folovllm.request import bad_words_token_ids
from folovllm.sampling_params import SamplingParams


def check_prompt_length(num_tokens: int, max_model_len: int, what: str = "prompt") -> None:
    """A prompt needs at least one token and room for at least one generated token."""
    if num_tokens == 0:
        raise ValueError(f"the {what} is empty; give at least one token")
    if num_tokens >= max_model_len:
        raise ValueError(f"the {what} has {num_tokens} tokens, but max_model_len is {max_model_len} "
                         "(the prompt plus at least one generated token must fit)")


def truncate_prompt(prompt_token_ids: list[int], truncate_prompt_tokens: int | None,
                    max_model_len: int) -> list[int]:
    """The prompt's last ``truncate_prompt_tokens`` tokens (-1: ``max_model_len`` of them)."""
    if truncate_prompt_tokens is None:
        return prompt_token_ids
    if truncate_prompt_tokens > max_model_len:
        raise ValueError(f"truncate_prompt_tokens must be at most max_model_len={max_model_len} "
                         f"(or -1 for max_model_len), got {truncate_prompt_tokens}")
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    return prompt_token_ids[-keep:]


def check_token_ids_in_vocab(params: SamplingParams, vocab_size: int) -> None:
    """Every token id a request names must be a row of the model's logits."""
    for name, ids in (("stop_token_ids", params.stop_token_ids),
                      ("logit_bias", params.logit_bias or ()),
                      ("allowed_token_ids", params.allowed_token_ids or ())):
        outside = sorted(t for t in ids if t >= vocab_size)
        if outside:
            raise ValueError(f"{name} must be in [0, {vocab_size}) for this model; "
                             f"out of vocabulary: {outside[:10]}")


def check_request_ids(prompt_ids: list[int], params: SamplingParams, vocab_size: int, tokenizer) -> tuple:
    """Every token id of the prompt and of the parameters is in the vocabulary; returns the request's
    ``bad_words`` as token-id sequences (empty without them)."""
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}); got an id outside")
    check_token_ids_in_vocab(params, vocab_size)
    bad_words = bad_words_token_ids(params.bad_words, tokenizer) if params.bad_words else ()
    if any(t >= vocab_size for ids in bad_words for t in ids):
        raise ValueError(f"bad_words must tokenize to ids in [0, {vocab_size}) for this model")
    return bad_words


def check_logprobs(params: SamplingParams, max_logprobs: int) -> None:
    """``logprobs`` and ``prompt_logprobs`` within the engine's ``max_logprobs`` (negative: no limit)."""
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if max_logprobs >= 0 and value is not None and value > max_logprobs:
            raise ValueError(f"{name}={value} is more than this engine's max_logprobs={max_logprobs} "
                             "(raise it with --max-logprobs)")
