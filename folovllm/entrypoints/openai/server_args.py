"""The server's flags and the settings built from them (CORS, limits, chat, LoRA), checked before the
engine starts."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

from folovllm import envs
from folovllm.config import EngineConfig
from folovllm.entrypoints.openai.chat_template import load_chat_template
from folovllm.entrypoints.openai.http_stack import HTTP_CHOICES, LOOP_CHOICES
from folovllm.entrypoints.openai.lora_serving import add_lora_server_args, runtime_updating_allowed
from folovllm.entrypoints.openai.metrics import METRICS_PREFIXES
from folovllm.entrypoints.openai.reasoning import REASONING_PARSERS
from folovllm.entrypoints.openai.tool_parsers import TOOL_PARSERS
from folovllm.entrypoints.openai.validation import ChatSettings, RequestLimits


@dataclass
class CORSConfig:
    """FastAPI's CORSMiddleware settings (vLLM's defaults: anything goes, no credentials)."""

    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


@dataclass
class ServerConfig:
    model_names: list[str]  # what clients may send as "model"; the first is the one reported
    api_key: str | None = None
    max_waiting_requests: int | None = None  # None: unbounded admission queue
    drain_timeout_s: float = 30.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    chat: ChatSettings = field(default_factory=ChatSettings)
    metrics_prefix: str = "vllm"
    prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens in responses
    log_requests: bool = False
    root_path: str = ""
    cors: CORSConfig = field(default_factory=CORSConfig)
    structured_outputs_backend: str = "auto"  # the engine's, for checking constraints here
    enable_lora: bool = False  # the engine's
    lora_modules: list[dict] = field(default_factory=list)  # --lora-modules, parsed
    allow_runtime_lora_updating: bool = False
    max_stored_responses: int = 1000  # responses kept for previous_response_id and GET (0: none)
    stored_response_ttl_s: float = 3600.0  # how long each is kept after it was created

    @property
    def model_name(self) -> str:
        return self.model_names[0]


def default_model_name(model_arg: str | None, model_path: str) -> str:
    if model_arg:
        return model_arg
    name = os.path.basename(model_path.rstrip("/"))
    return name.split(".")[0] if name.endswith(".gguf") else name


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Frontend")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model name(s) clients may send; the first is the one reported "
                        "(default: --model, or the default model's name)")
    g.add_argument("--api-key", default=envs.value("FOLOVLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize "
                        "(default: $FOLOVLLM_API_KEY)")
    g.add_argument("--max-waiting-requests", type=int, default=None,
                   help="queued requests beyond this get 503 + Retry-After (default: unbounded)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds to let in-flight requests finish before aborting them")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument("--uvicorn-log-level", default=None,
                   choices=["debug", "info", "warning", "error", "critical", "trace"],
                   help="uvicorn's own log level (default: --log-level)")
    g.add_argument("--uvicorn-http", default="auto", choices=HTTP_CHOICES,
                   help="HTTP parser: auto takes httptools (C, less CPU per streamed chunk) when installed, "
                        "else h11")
    g.add_argument("--uvicorn-loop", default="auto", choices=LOOP_CHOICES,
                   help="event loop: auto takes uvloop when installed, else asyncio")
    g.add_argument("--enable-log-requests", action="store_true",
                   help="log each request as it reaches the engine (id, prompt length, sampling params)")
    g.add_argument("--disable-log-requests", dest="enable_log_requests", action="store_false",
                   help="do not log requests (the default; vLLM's older spelling)")
    g.add_argument("--metrics-prefix", default="vllm", choices=list(METRICS_PREFIXES),
                   help="prefix of the /metrics series: vllm (dashboards written for vLLM work as they "
                        "are) or folovllm")
    g.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="report usage.prompt_tokens_details.cached_tokens (prompt tokens served from "
                        "the prefix cache); otherwise it is null")
    g.add_argument("--root-path", default="",
                   help="the path prefix under which a path-routing proxy serves this app")
    g.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (PEM)")
    g.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    cors = CORSConfig()
    g.add_argument("--allowed-origins", nargs="+", type=_json_list, default=[cors.allowed_origins],
                   help='CORS allowed origins, as values or a JSON list (default: ["*"])')
    g.add_argument("--allowed-methods", nargs="+", type=_json_list, default=[cors.allowed_methods],
                   help='CORS allowed methods (default: ["*"])')
    g.add_argument("--allowed-headers", nargs="+", type=_json_list, default=[cors.allowed_headers],
                   help='CORS allowed headers (default: ["*"])')
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    limits = RequestLimits()
    g.add_argument("--max-request-body-bytes", type=int, default=limits.max_request_body_bytes,
                   help="larger request bodies get 413 (default: %(default)s)")
    g.add_argument("--max-prompts-per-request", type=int, default=limits.max_prompts_per_request,
                   help="prompts in one /v1/completions request (default: %(default)s)")
    g.add_argument("--max-n", type=int, default=limits.max_n,
                   help="largest n (samples per prompt) a request may ask for (default: %(default)s)")
    g.add_argument("--max-stop-strings", type=int, default=limits.max_stop_strings,
                   help="stop strings (and stop_token_ids, bad_words) per request (default: %(default)s)")
    g.add_argument("--max-stop-string-chars", type=int, default=limits.max_stop_string_chars,
                   help="length of each stop string and bad word (default: %(default)s)")
    g.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                   help="step the engine on a thread of the server process instead of its own process")
    g.add_argument("--max-stored-responses", type=int, default=ServerConfig.max_stored_responses,
                   help="Responses API: responses kept in memory (store: true) for previous_response_id and "
                        "GET/DELETE /v1/responses/{id}; past this many the oldest is dropped; 0 keeps none "
                        "(default: %(default)s)")
    g.add_argument("--stored-response-ttl", type=float, default=ServerConfig.stored_response_ttl_s,
                   metavar="SECONDS", help="Responses API: how long a stored response is kept after it was "
                                           "created (default: %(default)s)")
    chat = parser.add_argument_group("chat")
    chat.add_argument("--chat-template", default=None,
                      help="a chat template file, or the template itself (used over the tokenizer's)")
    chat.add_argument("--trust-request-chat-template", action="store_true",
                      help="run a chat_template sent with a request (otherwise such a request gets 400)")
    chat.add_argument("--tool-call-parser", default=None, metavar="NAME",
                      help=f"reads the model's tool calls for tool_choice \"auto\": {', '.join(sorted(TOOL_PARSERS))}")
    chat.add_argument("--enable-auto-tool-choice", action="store_true",
                      help="let the model decide whether to call tools (tool_choice \"auto\"; needs "
                           "--tool-call-parser)")
    chat.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                      help="do not show the tools to the chat template when tool_choice is \"none\"")
    chat.add_argument("--reasoning-parser", default=None, metavar="NAME",
                      help="splits the reasoning from the answer into \"reasoning\" / \"reasoning_content\": "
                           f"{', '.join(sorted(REASONING_PARSERS))}")


    add_lora_server_args(parser)


def chat_settings(args: argparse.Namespace) -> ChatSettings:
    """The chat flags, checked (unknown parser names, a template file that cannot be read)."""
    return ChatSettings(
        chat_template=load_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template,
        tool_call_parser=args.tool_call_parser, enable_auto_tool_choice=args.enable_auto_tool_choice,
        reasoning_parser=args.reasoning_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none)


def _json_list(value: str) -> list[str]:
    """A flag value that is a JSON list of strings (vLLM's form) or one plain string."""
    if not value.startswith("["):
        return [value]
    try:
        items = json.loads(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a JSON list: {value!r} ({err})") from err
    if not all(isinstance(item, str) for item in items):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {value!r}")
    return items


def server_config(args: argparse.Namespace, engine_config: EngineConfig, model_path: str,
                  limits: RequestLimits, chat: ChatSettings) -> ServerConfig:
    """The app's settings from the parsed flags (the model's path names it when no name is given)."""
    cors = CORSConfig(*(sum(getattr(args, name), []) for name in
                        ("allowed_origins", "allowed_methods", "allowed_headers")), args.allow_credentials)
    return ServerConfig(
        model_names=args.served_model_name or [default_model_name(args.model, model_path)],
        api_key=args.api_key or None, max_waiting_requests=args.max_waiting_requests,
        drain_timeout_s=args.drain_timeout, limits=limits, chat=chat, metrics_prefix=args.metrics_prefix,
        prompt_tokens_details=args.enable_prompt_tokens_details, log_requests=args.enable_log_requests,
        root_path=args.root_path, cors=cors, structured_outputs_backend=engine_config.structured_outputs_backend,
        enable_lora=engine_config.enable_lora, lora_modules=args.lora_modules,
        allow_runtime_lora_updating=runtime_updating_allowed(args.allow_runtime_lora_updating),
        max_stored_responses=args.max_stored_responses, stored_response_ttl_s=args.stored_response_ttl)
