"""Engine knobs on the command line, derived from ``EngineConfig``'s fields (named as in vLLM's CLI).

Each field's metadata gives its flag, aliases and ``--help`` group (vLLM's config class names), so a
command line written for ``vllm serve`` parses here with the same meanings.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Collection
from typing import Any

from folovllm.attention.backend import attention_backend_names
from folovllm.config import CONFIG_GROUPS, DTYPE_ALIASES, NO_EFFECT, EngineConfig
from folovllm.core.admission import admission_mode_names
from folovllm.core.policy import policy_names
from folovllm.kv_transfer.base import kv_connector_names

# Fields whose choices are whatever is registered (see folovllm/registry.py).
_REGISTERED_CHOICES: dict[str, Callable[[], list[str]]] = {
    "attention_backend": lambda: ["auto", *attention_backend_names()],
    "scheduling_policy": policy_names,
    "admission": admission_mode_names,
    "kv_connector": kv_connector_names,
}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _dtype(text: str) -> str:
    return DTYPE_ALIASES.get(text, text)


_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "dict[str, Any]": _json_object}
_FIELD_TYPES: dict[str, Callable[[str], Any]] = {"dtype": _dtype}


def _value_type(annotation: str) -> Callable[[str], Any] | None:
    """``int | None`` -> int; a str (or mixed) field is left to the config to parse."""
    parts = [p.strip() for p in str(annotation).split("|") if p.strip() != "None"]
    return _TYPES.get(parts[0]) if len(parts) == 1 else None


def engine_option_groups(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """The parser's option groups named after vLLM's config classes, created in vLLM's order."""
    existing = {g.title: g for g in parser._action_groups}
    return {name: existing.get(name) or parser.add_argument_group(name) for name in CONFIG_GROUPS}


def add_engine_args(parser: argparse.ArgumentParser, only: Collection[str] | None = None) -> None:
    """One option per EngineConfig field that has a flag, with the field's default, help and aliases
    (``only``: just these fields, e.g. the scheduler's for ``simulate``)."""
    groups = engine_option_groups(parser)
    for f in dataclasses.fields(EngineConfig):
        meta = f.metadata
        if not meta.get("cli", False) or (only is not None and f.name not in only):
            continue
        group = groups[meta["group"]]
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        help_text = f"{NO_EFFECT}: {meta['no_effect']}" if meta["no_effect"] else meta["help"]
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text}
        aliases = list(meta["aliases"])
        if isinstance(f.default, bool):
            if flag.startswith("--no-"):
                kwargs["action"] = "store_false" if f.default else "store_true"
            elif f.default:  # vLLM's --x / --no-x pair
                kwargs.update(action=argparse.BooleanOptionalAction, default=True)
            else:
                kwargs["action"] = "store_true"
            switches = [a for a in aliases if a.startswith("--")]
            aliases = [a for a in aliases if not a.startswith("--")]
        else:
            switches = []
            if flag.startswith("--no-"):  # a default such as "auto" that the flag turns off
                kwargs.update(action="store_const", const=False, default=f.default)
            else:
                choices = _REGISTERED_CHOICES[f.name]() if f.name in _REGISTERED_CHOICES else meta["choices"]
                value_type = _FIELD_TYPES.get(f.name) or _value_type(f.type)
                kwargs.update(default=f.default, type=value_type, choices=choices)
        group.add_argument(flag, *aliases, **kwargs)
        for switch in switches:  # another spelling that turns the boolean on or off
            group.add_argument(switch, dest=f.name, default=argparse.SUPPRESS,
                               action="store_false" if switch.startswith("--no-") else "store_true",
                               help=f"same as {'--no-' + flag[2:] if switch.startswith('--no-') else flag}")


def add_model_positional(parser: argparse.ArgumentParser) -> None:
    """``folovllm serve MODEL`` as ``vllm serve MODEL``: the model as a positional (``--model`` stays)."""
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="a .gguf file, an HF folder or a Hugging Face hub id (same as --model)")


def merge_model_tag(args: argparse.Namespace) -> None:
    """Moves a positional MODEL into ``args.model``; both given and different is an error."""
    tag = getattr(args, "model_tag", None)
    if tag is None:
        return
    if getattr(args, "model", None) not in (None, tag):
        raise ValueError(f"the model is given twice: positional {tag!r} and --model {args.model!r}; "
                         "give one")
    args.model = tag


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every EngineConfig field that the parsed arguments carry."""
    merge_model_tag(args)
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in names})
