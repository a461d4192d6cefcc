"""Which pooling a model gets: ``--pooler-config``, else its sentence-transformers files, else LAST, normalized.

A sentence-transformers folder says how it pools in ``modules.json`` (its modules, in order) and the
Pooling module's ``config.json`` (``pooling_mode_*``); a ``Normalize`` module means unit-norm output.
Modules that would change the vectors and are not implemented here (a ``Dense`` projection, max
pooling, a pooling that drops the prompt) are refused rather than ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

POOLING_TYPES = ("LAST", "MEAN", "CLS", "ALL")
_CONFIG_KEYS = ("pooling_type", "normalize")
# sentence-transformers' pooling_mode_* flags that name a type here
_ST_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}
_ST_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class PoolerConfig:
    """The model's pooling: ``pooling_type`` (one of POOLING_TYPES) and whether results are normalized
    by default (a request's ``PoolingParams.normalize`` overrides it)."""

    pooling_type: str = "LAST"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}; got {self.pooling_type!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"pooler_config normalize must be true or false; got {self.normalize!r}")


def pooler_config_for(given: dict[str, Any] | None, model_path: str) -> PoolerConfig:
    """The pooling of the model at ``model_path``: ``given`` (``--pooler-config``) key by key over what
    its sentence-transformers files say, over the defaults."""
    settings = sentence_transformers_pooling(model_path)
    if given is not None:
        unknown = sorted(set(given) - set(_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"pooler_config keys {unknown} are not implemented; use {', '.join(_CONFIG_KEYS)}")
        settings.update(given)
    if isinstance(settings.get("pooling_type"), str):
        settings["pooling_type"] = settings["pooling_type"].upper()
    return PoolerConfig(**settings)


def sentence_transformers_pooling(model_path: str) -> dict[str, Any]:
    """``pooling_type`` and ``normalize`` from a sentence-transformers folder's files; {} without them."""
    modules_file = os.path.join(model_path, "modules.json")
    if not os.path.isfile(modules_file):
        return {}
    with open(modules_file) as f:
        modules = json.load(f)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in _ST_MODULES]
    if unknown:
        raise ValueError(f"{modules_file} lists sentence-transformers modules {unknown}, which are not "
                         f"implemented (only {', '.join(_ST_MODULES)})")
    settings: dict[str, Any] = {"normalize": "Normalize" in kinds}
    for module, kind in zip(modules, kinds):
        if kind == "Pooling":
            settings["pooling_type"] = _st_pooling_type(os.path.join(model_path, module.get("path", ""), "config.json"))
    return settings


def _st_pooling_type(config_file: str) -> str:
    with open(config_file) as f:
        config = json.load(f)
    if config.get("include_prompt", True) is False:
        raise ValueError(f"{config_file}: include_prompt=false (pooling without the prompt) is not implemented")
    on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if len(on) != 1 or on[0] not in _ST_MODES:
        raise ValueError(f"{config_file}: pooling modes {on} are not implemented; one of "
                         f"{', '.join(_ST_MODES)} must be set")
    return _ST_MODES[on[0]]
