"""Engine knobs on the command line, derived from ``EngineConfig``'s fields (named as in vLLM's CLI)."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from folovllm.attention.backend import attention_backend_names
from folovllm.config import EngineConfig
from folovllm.core.admission import admission_mode_names
from folovllm.core.policy import policy_names

# Fields whose choices are whatever is registered (see folovllm/registry.py).
_REGISTERED_CHOICES: dict[str, Callable[[], list[str]]] = {
    "attention_backend": lambda: ["auto", *attention_backend_names()],
    "scheduling_policy": policy_names,
    "admission": admission_mode_names,
}
_TYPES = {"int": int, "float": float}


def _value_type(annotation: str) -> type | None:
    """``int | None`` -> int; a str (or mixed) field is left to the config to parse."""
    parts = [p.strip() for p in str(annotation).split("|") if p.strip() != "None"]
    return _TYPES.get(parts[0]) if len(parts) == 1 else None


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One option per EngineConfig field that has a flag, with the field's default and help."""
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        meta = f.metadata
        if not meta.get("cli", False):
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kwargs = {"dest": f.name, "help": meta["help"]}
        if isinstance(f.default, bool):
            kwargs["action"] = "store_false" if f.default else "store_true"
        elif flag.startswith("--no-"):  # a default such as "auto" that the flag turns off
            kwargs.update(action="store_const", const=False, default=f.default)
        else:
            choices = _REGISTERED_CHOICES[f.name]() if f.name in _REGISTERED_CHOICES else meta["choices"]
            kwargs.update(default=f.default, type=_value_type(f.type), choices=choices)
        group.add_argument(flag, **kwargs)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every EngineConfig field that the parsed arguments carry."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in names})
