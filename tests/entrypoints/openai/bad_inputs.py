"""A corpus of bad requests: each is (name, method, path, body, headers, status).

``body`` is a dict (sent as JSON), bytes (sent as they are) or None. Every case must get its status
with an OpenAI error body (Anthropic's on the Messages API's paths), and leave the server serving
everyone else.
"""
from __future__ import annotations

import json

CMPL, CHAT, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
RESP, MSGS, COUNT = "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
JSON = {"Content-Type": "application/json"}
MSG = [{"role": "user", "content": "Hi"}]


def _completion(**fields) -> dict:
    return {"prompt": "Hi", "max_tokens": 2, **fields}


def _chat(**fields) -> dict:
    return {"messages": MSG, "max_tokens": 2, **fields}


def _response(**fields) -> dict:
    return {"input": "Hi", "max_output_tokens": 2, **fields}


def _message(**fields) -> dict:
    return {"model": "smol", "messages": MSG, "max_tokens": 2, **fields}


def _raw(text: str) -> bytes:
    return text.encode()


CASES: list[tuple[str, str, str, object, dict, int]] = []


def case(name: str, path: str, body, status: int = 400, method: str = "POST",
         headers: dict | None = None) -> None:
    CASES.append((name, method, path, body, headers if headers is not None else JSON, status))


# -- malformed bodies and content types, on every endpoint that takes a body --------------------
for path in (CMPL, CHAT, TOK, DETOK, RESP, MSGS, COUNT):
    tag = path.strip("/").replace("/", "_")
    case(f"{tag}-truncated-json", path, _raw('{"prompt": "Hi",'))
    case(f"{tag}-not-json", path, _raw("not json"))
    case(f"{tag}-empty-body", path, b"")
    case(f"{tag}-json-array", path, _raw("[1, 2, 3]"))
    case(f"{tag}-json-string", path, _raw('"hello"'))
    case(f"{tag}-json-null", path, _raw("null"))
    case(f"{tag}-invalid-utf8", path, b'{"prompt": "\xff\xfe"}')
    case(f"{tag}-form-encoded", path, _raw("prompt=Hi"), headers={"Content-Type": "application/x-www-form-urlencoded"})
    case(f"{tag}-deep-nesting", path, _raw("[" * 100_000 + "]" * 100_000))
    case(f"{tag}-lone-surrogate-key", path, _raw('{"\\ud800": 1, "prompt": "Hi", "messages": [], "tokens": []}'))

# -- wrong types ------------------------------------------------------------------------------
for field, value in [
    ("n", "2"), ("n", 1.5), ("n", True), ("temperature", "hot"), ("temperature", None),
    ("temperature", True), ("top_p", []), ("stop", 5), ("stop", [1]), ("stop", {"a": 1}),
    ("seed", 1.5), ("seed", "1"), ("priority", "x"), ("user", 5), ("stream", "yes"),
    ("stream_options", {"include_usage": "x"}), ("stream_options", 3), ("stream_options", {"continuous_usage_stats": "yes"}),
    ("presence_penalty", "0"), ("top_k", 1.5), ("min_p", "0"), ("ignore_eos", 1), ("min_tokens", "1"),
    ("repetition_penalty", {}), ("stop_token_ids", "1"), ("stop_token_ids", [1.5]),
    ("include_stop_str_in_output", "no"), ("skip_special_tokens", 0), ("cache_salt", 5),
    ("max_tokens", 1.5), ("max_tokens", "many"), ("logprobs", True), ("echo", "no"),
    ("model", 5), ("add_special_tokens", "yes"),
]:
    case(f"completion-{field}-{type(value).__name__}-{json.dumps(value)[:12]}", CMPL, _completion(**{field: value}))
for prompt in (5, None, 1.5, [1.5], [[1, "a"]], {"a": 1}, [None], [[[1]]], True):
    case(f"completion-prompt-{json.dumps(prompt)}", CMPL, {"prompt": prompt, "max_tokens": 2})
case("completion-no-prompt", CMPL, {"max_tokens": 2})
case("completion-prompt_logprobs-bool", CMPL, _completion(prompt_logprobs=True))
case("completion-prompt-logprobs-streamed", CMPL, _completion(prompt_logprobs=1, stream=True))
case("chat-prompt-logprobs-streamed", CHAT, _chat(prompt_logprobs=1, stream=True))
case("chat-prompt-logprobs-21", CHAT, _chat(prompt_logprobs=21))
case("completion-echo-max-tokens-0-logprobs-21", CMPL, _completion(echo=True, max_tokens=0, logprobs=21))

# -- out of range, non-finite -------------------------------------------------------------------
for field, value in [
    ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("min_p", -0.1), ("min_p", 2), ("n", 0),
    ("n", -1), ("n", 10**6), ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 10**30),
    ("max_tokens", 600), ("min_tokens", 10**30), ("min_tokens", -1), ("logprobs", 21),
    ("logprobs", -1), ("top_k", -5), ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("repetition_penalty", 0), ("repetition_penalty", 3), ("seed", 2**64), ("seed", -(2**64)),
    ("cache_salt", ""), ("user", "u" * 1000), ("prompt_logprobs", 21), ("prompt_logprobs", -1),
]:
    case(f"completion-range-{field}-{str(value)[:12]}", CMPL, _completion(**{field: value}))
for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):
    for field in ("temperature", "top_p", "presence_penalty", "repetition_penalty", "min_p"):
        case(f"completion-nonfinite-{field}-{literal}", CMPL,
             _raw(f'{{"prompt": "Hi", "max_tokens": 2, "{field}": {literal}}}'))
case("chat-nonfinite-temperature", CHAT, _raw('{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'))

# -- token ids outside the vocabulary -----------------------------------------------------------
for ids in ([999999], [-1], [2**63], [2**64], [10**30]):
    case(f"completion-stop-ids-{ids[0]}", CMPL, _completion(stop_token_ids=ids, min_tokens=1))
    case(f"chat-stop-ids-{ids[0]}", CHAT, _chat(stop_token_ids=ids, min_tokens=1))
    case(f"completion-prompt-ids-{ids[0]}", CMPL, {"prompt": [1, 2] + ids, "max_tokens": 2})
    case(f"detokenize-{ids[0]}", DETOK, {"tokens": ids})
case("completion-prompt-ids-batch-one-bad", CMPL, {"prompt": [[1, 2], [999999]], "max_tokens": 2})
case("completion-prompt-empty-ids", CMPL, {"prompt": [[]], "max_tokens": 2})
case("completion-prompt-empty-string", CMPL, {"prompt": "", "max_tokens": 2})
case("completion-prompt-empty-list", CMPL, {"prompt": [], "max_tokens": 2})

# -- huge bodies and lists ----------------------------------------------------------------------
case("completion-body-too-large", CMPL, {"prompt": "x" * (3 * 2**20)}, status=413)
case("chat-body-too-large", CHAT, {"messages": [{"role": "user", "content": "x" * (3 * 2**20)}]}, status=413)
case("tokenize-body-too-large", TOK, {"prompt": "x" * (3 * 2**20)}, status=413)
case("detokenize-body-too-large", DETOK, {"tokens": [1] * (1 * 2**20)}, status=413)
case("completion-prompt-too-many-chars", CMPL, {"prompt": "hello " * 100_000, "max_tokens": 2})
case("tokenize-too-many-chars", TOK, {"prompt": "hello " * 100_000})
case("completion-prompt-too-many-tokens", CMPL, {"prompt": list(range(100, 700)), "max_tokens": 2})
case("completion-too-many-prompts", CMPL, {"prompt": ["Hi"] * 129, "max_tokens": 2})
case("completion-n-over-limit", CMPL, _completion(n=129))
case("completion-prompts-times-n-over-limit", CMPL, {"prompt": ["Hi"] * 64, "n": 3, "max_tokens": 2})
case("chat-n-over-limit", CHAT, _chat(n=129))
case("completion-too-many-stops", CMPL, _completion(stop=[f"s{i}" for i in range(65)]))
case("completion-stop-too-long", CMPL, _completion(stop=["x" * 1001]))
case("completion-too-many-stop-ids", CMPL, _completion(stop_token_ids=list(range(65))))
case("chat-too-many-stops", CHAT, _chat(stop=[f"s{i}" for i in range(65)]))
case("completion-empty-stop", CMPL, _completion(stop=[""]))
case("chat-too-many-tokens", CHAT, {"messages": [{"role": "user", "content": "hello " * 600}]})

# -- Unicode ------------------------------------------------------------------------------------
for where, body in [
    ("completion-prompt", _raw('{"prompt": "a\\ud800b", "max_tokens": 2}')),
    ("completion-prompt-list", _raw('{"prompt": ["ok", "a\\udfffb"], "max_tokens": 2}')),
    ("completion-stop", _raw('{"prompt": "Hi", "max_tokens": 2, "stop": ["\\ud83d"]}')),
    ("completion-user", _raw('{"prompt": "Hi", "max_tokens": 2, "user": "\\udc00"}')),
    ("completion-model", _raw('{"prompt": "Hi", "max_tokens": 2, "model": "\\ud800"}')),
    ("completion-cache-salt", _raw('{"prompt": "Hi", "max_tokens": 2, "cache_salt": "\\ud800"}')),
    ("chat-content", _raw('{"messages": [{"role": "user", "content": "a\\ud800b"}]}')),
    ("chat-part", _raw('{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}')),
    ("chat-extra-name", _raw('{"messages": [{"role": "user", "content": "Hi", "name": "\\ud800"}]}')),
    ("tokenize-prompt", _raw('{"prompt": "a\\ud800b"}')),
    ("tokenize-messages", _raw('{"messages": [{"role": "user", "content": "\\udbff"}]}')),
    ("completion-unknown-field", _raw('{"prompt": "Hi", "max_tokens": 2, "xyz": "\\ud800"}')),
]:
    case(f"unicode-{where}", CMPL if where.startswith("completion") else CHAT if where.startswith("chat") else TOK, body)

# -- fields this server does not implement ------------------------------------------------------
for field, value in [
    ("best_of", 2), ("suffix", "x"), ("use_beam_search", True),
    ("length_penalty", 0.5), ("guided_whitespace_pattern", "[ ]*"),
    ("logits_processors", ["x"]), ("spaces_between_special_tokens", False),
    ("prompt_embeds", "AAAA"),
]:
    case(f"unsupported-completion-{field}", CMPL, _completion(**{field: value}))
for field, value in [
    ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("audio", {"voice": "alloy"}), ("modalities", ["text", "audio"]), ("prediction", {"type": "content", "content": "x"}),
    ("reasoning_effort", "high"),
    ("echo", True), ("store", True), ("web_search_options", {}),
]:
    case(f"unsupported-chat-{field}", CHAT, _chat(**{field: value}))
# -- chat options the shared server refuses as started (no tool-call parser, no trusted templates) --
for name, fields in [
    ("tools-mean-auto", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("tool-choice-without-tools", {"tool_choice": "auto"}),
    ("tool-choice-unknown-tool", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                  "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    ("tool-type-custom", {"tools": [{"type": "custom", "custom": {"name": "f"}}], "tool_choice": "required"}),
    ("template-kwargs-reserved", {"chat_template_kwargs": {"tokenize": True}}),
    ("continue-and-generation-prompt", {"continue_final_message": True}),
    ("untrusted-template", {"chat_template": "{{ messages }}"}),
]:
    case(f"refused-chat-{name}", CHAT, _chat(**fields))
# -- structured outputs that are malformed, ambiguous or do not compile ------------------------
for name, fields in [
    ("format-type", {"response_format": {"type": "xml"}}),
    ("format-schema-missing", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
    ("format-schema-not-object", {"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}),
    ("format-schema-bad", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}),
    ("format-tag-empty", {"response_format": {"type": "structural_tag"}}),
    ("guided-json-bad", {"guided_json": '{"type": 5}'}),
    ("guided-json-not-json", {"guided_json": "{oops"}),
    ("guided-regex-bad", {"guided_regex": "("}),
    ("guided-choice-empty", {"guided_choice": []}),
    ("guided-choice-not-strings", {"guided_choice": [1, 2]}),
    ("guided-grammar-bad", {"guided_grammar": 'root ::= "a" |'}),
    ("guided-backend", {"guided_regex": "a", "guided_decoding_backend": "outlines"}),
    ("two-constraints", {"guided_regex": "a", "guided_choice": ["a"]}),
    ("so-two-kinds", {"structured_outputs": {"regex": "a", "choice": ["a"]}}),
    ("so-none", {"structured_outputs": {}}),
    ("so-unknown-key", {"structured_outputs": {"regex": "a", "backend": "outlines"}}),
    ("so-regex-bad", {"structured_outputs": {"regex": "[z-a]"}}),
    ("so-tag-bad", {"structured_outputs": {"structural_tag": "{"}}),
]:
    case(f"structured-completion-{name}", CMPL, _completion(**fields))
    case(f"structured-chat-{name}", CHAT, _chat(**fields))
case("unsupported-chat-image", CHAT, {"messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
case("unsupported-chat-audio-part", CHAT, {"messages": [{"role": "user", "content": [
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]})

# -- token constraints and their bounds (vocabulary 49152, max_model_len 512) --------------------
for field, value in [
    ("logit_bias", {"abc": 1}), ("logit_bias", {"-1": 1}), ("logit_bias", {"1": 100.5}),
    ("logit_bias", {"1": "5"}), ("logit_bias", {"1": None}), ("logit_bias", [1]), ("logit_bias", {"49152": 1}),
    ("logit_bias", {"1" * 30: 1}),
    ("allowed_token_ids", []), ("allowed_token_ids", [-1]), ("allowed_token_ids", [49152]),
    ("allowed_token_ids", ["1"]), ("allowed_token_ids", 5), ("bad_words", [""]), ("bad_words", "x"),
    ("bad_words", [5]), ("bad_words", ["x"] * 65), ("bad_words", ["x" * 1001]), ("bad_words", ["   "]),
    ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2), ("truncate_prompt_tokens", 513),
    ("truncate_prompt_tokens", "5"), ("truncate_prompt_tokens", 1.5), ("return_token_ids", "yes"),
    ("return_tokens_as_token_ids", 1),
]:
    case(f"constraint-completion-{field}-{json.dumps(value)[:24]}", CMPL, _completion(**{field: value}))
for field, value in [("logit_bias", {"49152": 1}), ("allowed_token_ids", []), ("truncate_prompt_tokens", 513),
                     ("bad_words", [""])]:
    case(f"constraint-chat-{field}-{json.dumps(value)[:24]}", CHAT, _chat(**{field: value}))

# -- chat shapes --------------------------------------------------------------------------------
for name, messages in [
    ("empty", []), ("string", "hi"), ("no-role", [{"content": "x"}]), ("bad-role", [{"role": "robot", "content": "x"}]),
    ("null-user-content", [{"role": "user", "content": None}]), ("number-content", [{"role": "user", "content": 5}]),
    ("part-without-text", [{"role": "user", "content": [{"type": "text"}]}]), ("not-objects", [1, 2]),
    ("null", None),
]:
    case(f"chat-messages-{name}", CHAT, {"messages": messages})
case("chat-max-completion-tokens-zero", CHAT, _chat(max_completion_tokens=0))
case("chat-top-logprobs-21", CHAT, _chat(logprobs=True, top_logprobs=21))
case("chat-top-logprobs-without-logprobs", CHAT, _chat(top_logprobs=2))
case("chat-logprobs-string", CHAT, _chat(logprobs="yes"))
case("chat-max-tokens-over-context", CHAT, _chat(max_tokens=10_000))

# -- Responses API shapes -----------------------------------------------------------------------
for name, value in [("number", 5), ("null", None), ("empty", ""), ("empty-list", []),
                    ("unknown-item", [{"type": "computer_call"}]), ("role-tool", [{"role": "tool", "content": "x"}]),
                    ("call-without-call-id", [{"type": "function_call", "name": "f", "arguments": "{}"}]),
                    ("output-without-call", [{"type": "function_call_output", "call_id": "c", "output": "x"}]),
                    ("image-part", [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])]:
    case(f"responses-input-{name}", RESP, _response(input=value))
for name, fields in [("hosted-tool", {"tools": [{"type": "file_search"}]}),
                     ("tool-without-name", {"tools": [{"type": "function"}]}),
                     ("choice-unknown", {"tool_choice": "sometimes"}),
                     ("text-format-unknown", {"text": {"format": {"type": "xml"}}}),
                     ("store-string", {"store": "yes"}), ("background", {"background": True}),
                     ("include", {"include": ["message.output_text.logprobs"]}),
                     ("truncation-auto", {"truncation": "auto"}), ("metadata-number", {"metadata": {"k": 1}}),
                     ("max-output-tokens-zero", {"max_output_tokens": 0})]:
    case(f"responses-{name}", RESP, _response(**fields))
case("responses-unknown-previous", RESP, _response(previous_response_id="resp_nonesuch"), status=404)
case("responses-get-unknown", RESP + "/resp_nonesuch", None, status=404, method="GET")
case("responses-delete-unknown", RESP + "/resp_nonesuch", None, status=404, method="DELETE")

# -- Messages API shapes (Anthropic's error body) ---------------------------------------------------
case("messages-no-max-tokens", MSGS, {"model": "smol", "messages": MSG})
case("messages-no-model", MSGS, {"messages": MSG, "max_tokens": 2})
case("messages-max-tokens-zero", MSGS, _message(max_tokens=0))
for name, messages in [("empty", []), ("empty-text", [{"role": "user", "content": ""}]),
                       ("bad-role", [{"role": "tool", "content": "x"}]),
                       ("unknown-block", [{"role": "user", "content": [{"type": "hologram"}]}]),
                       ("image", [{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                       ("result-without-use", [{"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]),
                       ("use-from-user", [{"role": "user", "content": [
                           {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
                       ("use-without-result", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
                           {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
                       ("use-input-string", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
                           {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}])]:
    case(f"messages-{name}", MSGS, _message(messages=messages))
for name, fields in [("server-tool", {"tools": [{"type": "bash_20250124", "name": "bash"}]}),
                     ("tool-without-schema", {"tools": [{"name": "f"}]}),
                     ("choice-tool-without-name", {"tool_choice": {"type": "tool"}}),
                     ("choice-unknown", {"tool_choice": {"type": "sometimes"}}),
                     ("named-tool-not-given", {"tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                               "tool_choice": {"type": "tool", "name": "g"}}),
                     ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 10}}),
                     ("system-image", {"system": [{"type": "image"}]}), ("top-k-string", {"top_k": "5"}),
                     ("stop-sequences-string", {"stop_sequences": "x"}), ("metadata-extra", {"metadata": {"x": 1}})]:
    case(f"messages-{name}", MSGS, _message(**fields))
case("messages-count-no-messages", COUNT, {"model": "smol"})
case("messages-unknown-model", MSGS, _message(model="claude-9"), status=404)
case("messages-unknown-subpath", MSGS + "/batches", {}, status=404)
case("messages-get", MSGS, None, status=405, method="GET")

# -- tokenize / detokenize shapes ---------------------------------------------------------------
case("tokenize-both", TOK, {"prompt": "Hi", "messages": MSG})
case("tokenize-neither", TOK, {})
case("tokenize-prompt-number", TOK, {"prompt": 5})
case("detokenize-string", DETOK, {"tokens": "abc"})
case("detokenize-nested", DETOK, {"tokens": [[1]]})
case("detokenize-missing", DETOK, {})

# -- routes, methods, models ------------------------------------------------------------------------
case("get-completions", CMPL, None, status=405, method="GET")
case("post-models", "/v1/models", {}, status=405)
case("unknown-path", "/v1/nope", {}, status=404)
case("unknown-root-path", "/nope", None, status=404, method="GET")
case("trailing-slash", CMPL + "/", _completion(), status=404)
case("delete-health", "/health", None, status=405, method="DELETE")
case("post-metrics", "/metrics", {}, status=405)
case("get-tokenize", TOK, None, status=405, method="GET")
case("put-chat", CHAT, _chat(), status=405, method="PUT")
case("unknown-model-completion", CMPL, _completion(model="gpt-9"), status=404)
case("unknown-model-chat", CHAT, _chat(model="gpt-9"), status=404)
case("unknown-model-tokenize", TOK, {"prompt": "Hi", "model": "gpt-9"}, status=404)

# -- authentication (the test adds the right key unless a case brings its own header) -------------
for path in (CMPL, CHAT, TOK, DETOK, "/v1/models", RESP, MSGS):
    tag = path.strip("/").replace("/", "_")
    for name, auth in [("none", None), ("wrong", "Bearer wrong"), ("non-ascii", "Bearer kéy-ü"),
                       ("basic", "Basic dGVzdDp0ZXN0"), ("bearer-only", "Bearer")]:
        headers = dict(JSON)
        headers["Authorization"] = auth if auth is not None else ""
        method = "GET" if path == "/v1/models" else "POST"
        body = None if method == "GET" else {"prompt": "Hi", "messages": MSG, "tokens": [1]}
        case(f"auth-{tag}-{name}", path, body, status=401, method=method, headers=headers)
