"""A model's generation_config.json as default sampling settings (vLLM's ``--generation-config``)."""
from __future__ import annotations

import json
import os
from typing import Any

# generation_config.json key -> SamplingParams field; the settings vLLM takes from it.
_SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def default_sampling_overrides(model_path: str, generation_config: str) -> dict[str, Any]:
    """SamplingParams fields whose defaults the model's generation config changes.

    ``generation_config``: "auto" reads generation_config.json beside the model (a GGUF file has
    none), "vllm" reads nothing (SamplingParams' own defaults), anything else is a folder holding
    one (a missing file there is an error).
    """
    if generation_config == "vllm":
        return {}
    if generation_config == "auto":
        folder = model_path if os.path.isdir(model_path) else None
        path = os.path.join(folder, "generation_config.json") if folder else None
        if path is None or not os.path.isfile(path):
            return {}
    else:
        path = os.path.join(generation_config, "generation_config.json")
        if not os.path.isfile(path):
            raise ValueError(f"generation_config {generation_config!r}: no generation_config.json there; "
                             "give 'auto', 'vllm' or a folder holding one")
    with open(path) as f:
        try:
            values = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path!r} is not valid JSON: {err}") from err
    overrides = {field: values[key] for key, field in _SAMPLING_KEYS.items() if values.get(key) is not None}
    if overrides.get("top_k") == 0:  # transformers' "off"
        overrides["top_k"] = -1
    return overrides
