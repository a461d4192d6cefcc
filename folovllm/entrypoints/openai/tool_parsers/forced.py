"""tool_choice "required" and a named tool: the JSON schema that forces the calls (enforced by
structured outputs, so any model can call tools) and the parsers that read what it forced.

"required" generates ``[{"name": <a tool>, "parameters": {..}}, ...]`` (at least one call);
a named tool generates that tool's arguments object alone.
"""
from __future__ import annotations

import json
from typing import Any

from folovllm.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ParsedToolText,
    ToolParser,
    loads_partial,
    loads_whole_strings,
)

_EMPTY_OBJECT = {"type": "object", "properties": {}}


def named_tool_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The schema of a named tool's arguments (an empty object for a tool without parameters)."""
    return parameters or dict(_EMPTY_OBJECT)


def required_tools_schema(functions: list[dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """The schema of a non-empty array of calls (exactly one unless ``parallel``), each
    ``{"name", "parameters"}`` of one of the given functions (``{"name": .., "parameters": ..}``
    dicts). Each tool's ``$defs`` move to the root, where its ``#/$defs/..`` references point."""
    variants, defs = [], {}
    for function in functions:
        parameters = dict(function.get("parameters") or _EMPTY_OBJECT)
        function_defs = parameters.pop("$defs", {})
        if not isinstance(function_defs, dict):
            raise ValueError(f"tool {function['name']!r}: parameters.$defs must be an object of schemas")
        for def_name, definition in function_defs.items():
            if defs.get(def_name, definition) != definition:
                raise ValueError(f"tools define $defs.{def_name} twice, differently; give the "
                                 "definitions distinct names")
            defs[def_name] = definition
        variants.append({"type": "object",
                         "properties": {"name": {"type": "string", "enum": [function["name"]]},
                                        "parameters": parameters},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


class RequiredToolCalls(ToolParser):
    """Reads the array that tool_choice "required" generates."""

    name = "required"

    def parse(self, text: str, final: bool) -> ParsedToolText:
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
        if isinstance(whole, list):
            return ParsedToolText("", [_call(item, item, complete=True) for item in whole])
        if final:
            return ParsedToolText(text)  # not what the schema forces: shown as it is
        partial, named = loads_partial(text.lstrip()), loads_whole_strings(text.lstrip())
        if not isinstance(partial, list):
            return ParsedToolText("")
        named = named if isinstance(named, list) else []
        return ParsedToolText("", [_call(item, named[i] if i < len(named) else None, i < len(partial) - 1)
                                   for i, item in enumerate(partial)])


def _call(item: Any, named: Any, complete: bool) -> ParsedToolCall:
    if not isinstance(item, dict):
        return ParsedToolCall(None)
    name = named.get("name") if isinstance(named, dict) else None
    return ParsedToolCall(name if isinstance(name, str) else None, item.get("parameters", {}), complete)


class NamedToolCall(ToolParser):
    """Reads what a named tool_choice generates: the whole text is that tool's arguments."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def parse(self, text: str, final: bool) -> ParsedToolText:
        return ParsedToolText("", [ParsedToolCall(self.function_name, text, complete=final, raw=True)])
