"""Pythonic tool calls (Llama 3.2/4, ToolACE): the reply is a Python list of calls with keyword
arguments, ``[get_weather(city="Paris"), get_time(zone="CET")]``; a reply that is not one is content."""
from __future__ import annotations

import ast

from folovllm.entrypoints.openai.tool_parsers.base import ParsedToolCall, ParsedToolText, ToolParser

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_MAX_TRIMS = 8  # a partial text is cut back this many times at most before giving up for this step


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def parse(self, text: str, final: bool) -> ParsedToolText:
        body = text.strip()
        if not body:
            return ParsedToolText("" if not final else text)
        if not body.startswith("["):
            return ParsedToolText(text)
        if final:
            calls = _calls(body, num_closed=None)
            return ParsedToolText("", calls) if calls is not None else ParsedToolText(text)
        closed, cut_points, _ = _scan(body)
        candidate = body
        for _ in range(_MAX_TRIMS):
            closers = _scan(candidate)[2]
            if closers is None:  # it ends inside an escape sequence: drop the backslash
                candidate = candidate[:-1]
                continue
            calls = _calls(candidate + closers, num_closed=closed)
            if calls is not None:
                return ParsedToolText("", calls)
            cut = next((c for c in reversed(cut_points) if c < len(candidate)), None)
            if cut is None:
                break
            candidate = body[:cut]
        return ParsedToolText("")


def _scan(text: str) -> tuple[int, list[int], str | None]:
    """Over a partial list of calls: how many top-level calls are closed; the places (after ``(``,
    before ``,``) where it can be cut back to something that parses once closed; and what closes
    every open string and bracket (None when it ends inside an escape sequence)."""
    stack: list[str] = []
    quote = None
    escaped = False
    closed = 0
    cuts = []
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in _OPENERS:
            stack.append(ch)
            if ch == "(":
                cuts.append(i + 1)
        elif ch in ")]}" and stack:
            opener = stack.pop()
            if opener == "(" and len(stack) == 1:
                closed += 1
        elif ch == ",":
            cuts.append(i)
    closers = None if escaped else (quote or "") + "".join(_OPENERS[o] for o in reversed(stack))
    return closed, cuts, closers


def _calls(source: str, num_closed: int | None) -> list[ParsedToolCall] | None:
    """The calls of a list expression; None when it is not a list of calls with literal keyword
    arguments. ``num_closed`` calls are complete (None: all); of the last open call, a non-string
    last argument is left out (it may still grow: ``1`` into ``12``)."""
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, RecursionError, ValueError):
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for i, node in enumerate(tree.elts):
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted_name(node.func)
        if name is None:
            return None
        complete = num_closed is None or i < num_closed
        arguments = {}
        for j, keyword in enumerate(node.keywords):
            if keyword.arg is None:
                return None
            try:
                value = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                if complete:
                    return None
                break
            if not complete and j == len(node.keywords) - 1 and not isinstance(value, str):
                break
            arguments[keyword.arg] = value
        calls.append(ParsedToolCall(name, arguments, complete))
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None
