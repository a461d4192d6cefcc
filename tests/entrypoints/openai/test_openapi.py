"""/openapi.json says what the server answers: 400 with the error body (never FastAPI's 422), text for
/metrics, an empty 200 for /health, this server's limits in the request schemas, only the routes its engine
serves; and the request models refuse what the server refuses. The live check is `make check-api`."""
from __future__ import annotations

import jsonschema
import pytest
from pydantic import ValidationError

from folovllm.engine.core_loop import EngineInfo
from folovllm.entrypoints.openai.protocol import CompletionRequest
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest, TokenizeRequest
from folovllm.entrypoints.openai.protocol_messages import CountTokensRequest, MessagesRequest
from folovllm.entrypoints.openai.protocol_responses import ResponsesRequest
from folovllm.entrypoints.openai.server_args import ServerConfig
from folovllm.entrypoints.openai.validation import RequestLimits
from folovllm.sampling_params import SamplingParams

MAX_MODEL_LEN = 128
MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
          "/tokenize": TokenizeRequest, "/v1/responses": ResponsesRequest, "/v1/messages": MessagesRequest,
          "/v1/messages/count_tokens": CountTokensRequest}


class _Core:
    """What build_app reads of an engine core before it starts: its info."""

    def __init__(self, pooling: bool) -> None:
        self.info = EngineInfo("model", MAX_MODEL_LEN, vocab_size=49152, pooling=pooling)


def _app(pooling: bool = False, **config):
    from folovllm.entrypoints.openai.api_server import build_app
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(default_model_path())
    except ValueError as err:
        pytest.skip(f"the default model's tokenizer is not installed: {err}")
    return build_app(_Core(pooling), tokenizer, ServerConfig(["smol"], **config))


def _schema(pooling: bool = False, **config) -> dict:
    return _app(pooling, **config).openapi()


@pytest.fixture(scope="module")
def schema() -> dict:
    return _schema(limits=RequestLimits(max_n=7, max_stop_strings=5))


def _body_schema(schema: dict, path: str) -> dict:
    """The request body's schema of ``path``, its references resolvable."""
    ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": schema["components"]}


def _valid(schema: dict, path: str, body: dict) -> bool:
    return jsonschema.Draft202012Validator(_body_schema(schema, path)).is_valid(body)


def test_errors_are_400_with_the_error_body_never_422(schema: dict) -> None:
    operations = [(path, op) for path, methods in schema["paths"].items() for op in methods.values()]
    assert operations
    for path, op in operations:
        assert "422" not in op["responses"]
        # the Messages API answers in Anthropic's error shape
        error = "AnthropicErrorBody" if path.startswith("/v1/messages") else "ErrorResponse"
        for status in ("400", "default"):
            body = op["responses"][status]["content"]["application/json"]["schema"]
            assert body == {"$ref": f"#/components/schemas/{error}"}, path
    error = schema["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_metrics_is_text_and_health_an_empty_200(schema: dict) -> None:
    assert list(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    for path, method in (("/health", "get"), ("/ping", "get"), ("/ping", "post")):
        assert "content" not in schema["paths"][path][method]["responses"]["200"], path
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"):
        streamed = schema["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(streamed) == {"application/json", "text/event-stream"}, path
    assert schema["paths"]["/v1/responses/{response_id}"]["get"]["responses"]["404"]["content"][
        "application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}


def test_the_schema_states_this_servers_limits(schema: dict) -> None:
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["n"]["maximum"] == 7 and props["n"]["minimum"] == 1
    assert props["max_tokens"]["maximum"] == MAX_MODEL_LEN
    assert props["stop_token_ids"]["maxItems"] == 5
    assert "x-server-limit" not in str(schema)
    assert props["kv_transfer_params"]["type"] == "null"  # no --kv-role
    detokenize = schema["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]
    assert detokenize["items"]["maximum"] == 49151


def test_only_the_routes_the_engine_serves_are_listed() -> None:
    generating, pooling = _schema()["paths"], _schema(pooling=True)["paths"]
    agent_apis = ("/v1/responses", "/v1/responses/{response_id}", "/v1/messages", "/v1/messages/count_tokens")
    assert "/v1/completions" in generating and "/v1/embeddings" not in generating
    assert all(path in generating for path in agent_apis)
    assert set(generating["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert "/v1/embeddings" in pooling and "/v1/completions" not in pooling
    assert not any(path in pooling for path in agent_apis)
    assert "/v1/load_lora_adapter" not in generating  # LoRA off: each call would be a 400
    with_lora = _schema(enable_lora=True, allow_runtime_lora_updating=True)["paths"]
    assert "/v1/load_lora_adapter" in with_lora


def test_a_wrong_method_is_a_405_naming_every_method_of_the_path() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(_app())  # no lifespan: routing alone
    for method, path, allowed in (("DELETE", "/v1/completions", "POST"), ("PUT", "/ping", "GET, POST"),
                                  ("POST", "/metrics", "GET")):
        response = client.request(method, path)
        assert (response.status_code, response.headers["allow"]) == (405, allowed), path
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": ["Hi", ""]}),
    ("/v1/chat/completions", {"messages": [{"role": "tool"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"tools": 1}}),
    ("/tokenize", {}),
    ("/tokenize", {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
    ("/v1/responses", {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}),
    ("/v1/responses", {"input": "Hi", "text": {"verbosity": "low"}}),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "web_search"}]}),
    ("/v1/messages", {"model": "smol", "max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/messages", {"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                      "tool_choice": {"type": "tool"}}),
    ("/v1/messages", {"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                      "tool_choice": {"type": "auto", "name": "f"}}),
    ("/v1/messages/count_tokens", {"model": "smol", "messages": [{"role": "user", "content": "Hi"}],
                                   "output_config": {"effort": "high"}}),
])
def test_what_the_server_refuses_the_schema_and_the_model_refuse(schema: dict, path: str, body: dict) -> None:
    assert not _valid(schema, path, body)
    # the others are the validator's or SamplingParams' (a 400 naming the field)
    if "chat_template_kwargs" not in body and body.get("max_tokens") != 0:
        with pytest.raises(ValidationError):
            MODELS[path].model_validate(body)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Hi"}),
    ("/v1/completions", {"prompt": [[1, 2], [3]], "n": 7, "temperature": 0, "top_p": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "assistant"}, {"role": "user", "content": "Hi"}]}),
    ("/tokenize", {"prompt": "Hi", "messages": None}),
    ("/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "No"}]},
                                 {"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]},
                                 {"role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
                                 {"role": "user", "content": "B"}], "temperature": 0, "top_p": 1}),
    ("/v1/messages", {"model": "smol", "max_tokens": MAX_MODEL_LEN, "stop_sequences": ["x"],
                      "messages": [{"role": "user", "content": "Hi"}], "tool_choice": {"type": "auto"}}),
    ("/v1/messages/count_tokens", {"model": "smol", "messages": [{"role": "user", "content": "Hi"}]}),
])
def test_what_the_server_takes_the_schema_takes(schema: dict, path: str, body: dict) -> None:
    assert _valid(schema, path, body)
    MODELS[path].model_validate(body)


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.5), ("top_p", 0), ("top_p", 1.01), ("min_p", 1.5), ("top_k", -2),
    ("presence_penalty", 2.5), ("frequency_penalty", -2.5), ("repetition_penalty", 0), ("repetition_penalty", 2.1),
    ("prompt_logprobs", 21), ("min_tokens", -1), ("seed", 2**63), ("n", 0),
])
def test_the_stated_ranges_are_sampling_params_ranges(schema: dict, field: str, value: float) -> None:
    """A range the schema states is the one SamplingParams checks: each side of its bounds agrees."""
    assert not _valid(schema, "/v1/completions", {"prompt": "Hi", field: value})
    with pytest.raises(ValueError):
        SamplingParams(**{field: value})


def test_a_message_of_no_role_is_a_400_in_anthropics_shape() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(_app())  # no lifespan: the body check alone
    body = {"model": "smol", "max_tokens": 4, "messages": [{"role": {}, "content": ""}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = client.post(path, json=body)
        assert response.status_code == 400, path
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"


def test_an_unexpected_error_is_a_500_in_the_shape_of_its_path() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from folovllm.entrypoints.openai.errors import install_error_handlers
    from folovllm.entrypoints.openai.serving_messages import anthropic_shaped

    app = FastAPI()

    async def fails() -> None:
        raise TypeError("a bug")

    for path in ("/v1/messages", "/v1/chat/completions"):
        app.add_api_route(path, fails, methods=["POST"])
    install_error_handlers(app, anthropic_shaped)
    client = TestClient(app, raise_server_exceptions=False)
    anthropic, openai = client.post("/v1/messages"), client.post("/v1/chat/completions")
    assert anthropic.status_code == openai.status_code == 500
    assert anthropic.json() == {"type": "error", "error": {"type": "api_error",
                                                           "message": "internal server error: TypeError"}}
    assert openai.json()["error"]["code"] == "internal_error"


@pytest.mark.parametrize("path, field, noop, other", [
    ("/v1/completions", "best_of", 1, True),
    ("/v1/chat/completions", "function_call", "none", {"name": "f"}),
    ("/v1/responses", "reasoning", {"effort": None}, {"effort": "high"}),
    ("/v1/messages/count_tokens", "function_call", None, {"a": 1}),
    ("/v1/messages/count_tokens", "thinking", None, {"type": "enabled"}),
])
def test_an_unimplemented_field_is_stated_with_its_no_op_value(schema: dict, path: str, field: str, noop,
                                                               other) -> None:
    """The schema takes an unimplemented field at its no-op value alone, as check_supported does."""
    hi = [{"role": "user", "content": "Hi"}]
    base = {"/v1/completions": {"prompt": "Hi"}, "/v1/chat/completions": {"messages": hi}, "/v1/responses": {"input": "Hi"},
            "/v1/messages/count_tokens": {"model": "smol", "messages": hi}}[path]
    assert _valid(schema, path, {**base, field: noop})
    MODELS[path].model_validate({**base, field: noop}).check_supported()
    assert not _valid(schema, path, {**base, field: other})
    with pytest.raises(ValueError, match=field):
        MODELS[path].model_validate({**base, field: other}).check_supported()
