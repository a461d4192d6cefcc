"""The request bodies the proxy sends: a one-token prefill to the producer, then the client's own
request, with the producer's ``kv_transfer_params``, to the consumer."""
from __future__ import annotations

import copy
from typing import Any

CHAT = "chat"
COMPLETIONS = "completions"
# Fields that ask for more than the one token a prefill returns (min_tokens > max_tokens is a 400).
_PREFILL_DROPS = ("stream_options", "min_tokens")


def check_body(body: Any) -> dict[str, Any]:
    """The client's JSON body as a dict; ValueError (a 400) for what the proxy cannot split in two."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object.")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ValueError(f"n must be 1 through the prefill/decode proxy (got {n!r}): one prefill feeds "
                         "one decode; send n separate requests instead.")
    return body


def prefill_body(body: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The producer's request: the client's, generating one token, unstreamed, asked to keep its KV
    for a remote decode."""
    prefill = {k: copy.deepcopy(v) for k, v in body.items() if k not in _PREFILL_DROPS}
    prefill["max_tokens"] = 1
    if endpoint == CHAT:
        prefill["max_completion_tokens"] = 1
    prefill["stream"] = False
    prefill["kv_transfer_params"] = {"do_remote_decode": True}
    return prefill


def decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The consumer's request: the client's, with the producer's ``kv_transfer_params`` as they came
    (none: the consumer computes the prefill itself)."""
    decode = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if kv_transfer_params is not None:
        decode["kv_transfer_params"] = kv_transfer_params
    return decode
