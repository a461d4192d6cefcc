"""The rules of a request body that JSON Schema cannot state, for `make check-api` (scripts/check_api.py).

/openapi.json states every rule of one field (ranges, lengths, this server's limits); these span fields
or need the model. Each is the server's, answered with a 400 that names it, and each is written in the
field's description or the validator's message. A positive test case that breaks one is dropped before it
is sent: schemathesis would otherwise call a correct 400 a schema-valid body refused. Negative cases are
left as drawn, so every refusal is still checked. A positive Messages body names the served model (the API
requires ``model``; any other name is a 404 before the body is read).
"""
from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

SERVER = json.loads(os.environ.get("CHECK_API_SERVER", "{}"))
# a chat template's own tokens around each message (SmolLM2's ChatML: "<|im_start|>role\n...<|im_end|>\n"),
# and its default system turn
_TEMPLATE_TOKENS_PER_MESSAGE, _TEMPLATE_TOKENS = 8, 32
_CONSTRAINT_FIELDS = ("guided_json", "guided_regex", "guided_grammar", "guided_choice", "structured_outputs")


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    meta = getattr(case, "meta", None)
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return True
    return not broken_rule(case.operation.path, case.body)


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = getattr(case, "meta", None)
    if (meta is not None and meta.generation.mode.is_positive and isinstance(case.body, dict)
            and case.operation.path.startswith("/v1/messages")):
        case.body["model"] = SERVER["model"]
    return case


def broken_rule(path: str, body: dict) -> str | None:
    """The first cross-field rule ``body`` breaks on ``path``, else None."""
    if path in ("/v1/completions", "/invocations") and "prompt" in body and "messages" not in body:
        return _completion_rule(body)
    if path in ("/v1/chat/completions", "/invocations") and "messages" in body:
        return _chat_rule(body)
    if path == "/v1/responses":
        return _responses_rule(body)
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return _messages_rule(body, counts_only=path.endswith("count_tokens"))
    if path == "/tokenize" and isinstance(body.get("messages"), list):
        return _template_rule(body)
    return None


def _sampling_rule(body: dict, max_tokens: int | None) -> str | None:
    """What SamplingRequest's fields ask of each other."""
    if max_tokens is not None and body.get("min_tokens", 0) > max_tokens:
        return "min_tokens is at most max_tokens"
    if body.get("prompt_logprobs") is not None and body.get("stream"):
        return "prompt_logprobs are not streamed"
    if any(not key.isdigit() or int(key) >= SERVER["vocab"] for key in body.get("logit_bias") or {}):
        return "logit_bias keys are token ids of the vocabulary"
    constraints = [name for name in _CONSTRAINT_FIELDS if body.get(name) is not None]
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        constraints.append("response_format")
    if len(constraints) > 1:
        return "one constraint per request"
    if constraints and constraints != ["guided_choice"] and not _json_object_only(body, response_format):
        return "a constraint (a schema, regex or grammar) must compile"
    if constraints and (body.get("min_tokens") or body.get("allowed_token_ids") or body.get("bad_words")):
        return "a constraint and settings that ban tokens must leave a token to generate"
    return None


def _json_object_only(body: dict, response_format: Any) -> bool:
    """The constraint is "any JSON object", which always compiles."""
    return isinstance(response_format, dict) and response_format.get("type") == "json_object"


def _completion_rule(body: dict) -> str | None:
    prompt = body["prompt"]
    prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], (int, float))) else prompt
    max_tokens = body.get("max_tokens", 16)
    if max_tokens == 0 and not body.get("echo"):
        return "max_tokens 0 scores the prompt: it needs echo"
    if len(prompts) * body.get("n", 1) > SERVER["max_sequences"]:
        return "prompts x n within the server's sequences per request"
    for one in prompts:
        tokens = _text_tokens(one) if isinstance(one, str) else len(one)
        broken = _fits(tokens + (1 if body.get("add_special_tokens", True) else 0), max_tokens or 1)
        if broken:
            return broken
    return _sampling_rule(body, max_tokens)


def _chat_rule(body: dict) -> str | None:
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        return "top_logprobs needs logprobs"
    tools = body.get("tools")
    choice = body.get("tool_choice")
    names = None if tools is None else [tool.get("function", {}).get("name") for tool in tools]
    broken = _tools_rule(names, choice, isinstance(choice, dict) or choice == "required")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return (broken or _template_rule(body) or _fits(_chat_tokens(body), max_tokens)
            or _sampling_rule(body, max_tokens))


def _tools_rule(names: list | None, choice: Any, forced: bool) -> str | None:
    """What tools (their names; None: no tools given) and tool_choice ask of each other, as chat has them
    (``forced``: a required or named call)."""
    if names is not None and len(set(names)) < len(names):
        return "tool names are unique"
    if choice not in (None, "none") and names is None:
        return "tool_choice needs tools"
    if forced:
        return "a required or named tool call constrains the output with its parameters' schema, which must compile"
    return None


def _responses_rule(body: dict) -> str | None:
    """A conversation of items: each call's output after its call, a reasoning item before what it led to."""
    calls, reasoning = set(), False  # reasoning: a reasoning item waits for what it led to
    for item in body["input"] if isinstance(body.get("input"), list) else ():
        kind = item.get("type", "message")
        if kind == "function_call_output" and item.get("call_id") not in calls:
            return "a function_call_output follows the function_call with its call_id"
        if kind == "function_call":
            if not _json_object_text(item.get("arguments", "")):
                return "a function call's arguments text is a JSON object"
            calls.add(item.get("call_id"))
        if kind == "reasoning":
            reasoning = True
        elif kind == "function_call" or kind == "message" and item.get("role") == "assistant":
            reasoning = False
    if reasoning:
        return "a reasoning item comes before the assistant message or function call it led to"
    tools, choice = body.get("tools"), body.get("tool_choice")
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        return "a text.format schema must compile"
    broken = _tools_rule(None if tools is None else [tool.get("name") for tool in tools], choice,
                         isinstance(choice, dict) or choice == "required")
    tokens = sum(_text_tokens(body.get(name)) for name in ("input", "instructions", "tools")) + _TEMPLATE_TOKENS
    return broken or _fits(tokens, body.get("max_output_tokens"))


def _messages_rule(body: dict, counts_only: bool) -> str | None:
    """Anthropic's conversation rules: content in every message but a final assistant one, each tool_use
    answered by a tool_result in the next message, and only there."""
    messages = body["messages"]
    open_calls: list = []
    for i, message in enumerate(messages):
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        final = i == len(messages) - 1
        if all(block["type"] == "text" and not block["text"] for block in blocks) and not (
                final and message["role"] == "assistant"):
            return "a message's content is not empty (but a final assistant message's)"
        answered = [block.get("tool_use_id") for block in blocks if block["type"] == "tool_result"]
        if any(call not in answered for call in open_calls) or any(call not in open_calls for call in answered):
            return "each tool_use is answered by a tool_result of the next message, and only there"
        open_calls = [block.get("id") for block in blocks if block["type"] == "tool_use"]
    if open_calls:
        return "the final message's tool_use blocks are answered"
    if (body.get("output_config") or {}).get("format") is not None:
        return "an output_config.format schema must compile"
    tools, choice = body.get("tools"), body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    broken = _tools_rule(None if tools is None else [tool.get("name") for tool in tools], kind,
                         kind in ("any", "tool"))
    if broken or counts_only:
        return broken
    tokens = _TEMPLATE_TOKENS + _text_tokens(body.get("system")) + _text_tokens(body.get("tools"))
    tokens += sum(_TEMPLATE_TOKENS_PER_MESSAGE + _text_tokens(message["content"]) for message in messages)
    return _fits(tokens, body["max_tokens"])


def _template_rule(body: dict) -> str | None:
    for message in body["messages"]:
        for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
            arguments = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(arguments, str) and arguments and not _json_object_text(arguments):
                return "a tool call's arguments text is a JSON object"
    if body.get("continue_final_message"):
        messages = body["messages"]
        if body.get("add_generation_prompt", True) or messages[-1].get("role") != "assistant":
            return "continue_final_message continues a last assistant message, without a generation prompt"
    return None


def _chat_tokens(body: dict) -> int:
    """At most the tokens the chat template makes of the messages (a byte-level BPE: a token per byte at
    most), tools and documents included."""
    tokens = _TEMPLATE_TOKENS
    for message in body["messages"]:
        tokens += (_TEMPLATE_TOKENS_PER_MESSAGE + _text_tokens(message.get("role"))
                   + _text_tokens(message.get("content")))
    for extra in ("tools", "documents"):
        if body.get(extra):
            tokens += len(json.dumps(body[extra]).encode())
    return tokens


def _text_tokens(value: Any) -> int:
    """An upper bound of the tokens of the text ``value`` holds."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    return len(json.dumps(value).encode())


def _fits(prompt_tokens: int, max_tokens: int | None) -> str | None:
    if prompt_tokens + (max_tokens or 1) > SERVER["max_model_len"]:
        return "the prompt and max_tokens fit max_model_len"
    return None


def _json_object_text(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
