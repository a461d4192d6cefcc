"""Serving LoRA adapters: ``--lora-modules`` (``name=path`` or vLLM's JSON form), the adapters in
``/v1/models`` (``parent``: the base model), and vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` behind ``--allow-runtime-lora-updating`` (or ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
A request's ``model`` names the adapter it runs with (``ServingContext.check_model``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field

from folovllm.engine.async_engine import AsyncLLMEngine, EngineError
from folovllm.entrypoints.openai.errors import APIError, bad_request
from folovllm.entrypoints.openai.openapi import TEXT_OK
from folovllm.entrypoints.openai.serving import ServingContext, engine_error, now_s
from folovllm.lora.request import LoRARequest

# vLLM's variable (a third-party name, read here as hub.py reads HF_HUB_OFFLINE); its true values
RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
_TRUE = ("1", "true", "yes", "on")


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


def parse_lora_module(value: str) -> dict:
    """One ``--lora-modules`` value: ``name=path`` or ``{"name": ..., "path": ..., "base_model_name": ...}``."""
    if value.lstrip().startswith("{"):
        try:
            spec = json.loads(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"--lora-modules: not JSON: {value!r} ({err})") from err
        unknown = sorted(set(spec) - {"name", "path", "base_model_name"})
        if unknown or not isinstance(spec.get("name"), str) or not isinstance(spec.get("path"), str):
            raise argparse.ArgumentTypeError(f"--lora-modules: a JSON module needs string 'name' and 'path' "
                                             f"(and optionally 'base_model_name'); got {value!r}")
        return spec
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules takes name=path or a JSON object; got {value!r}")
    return {"name": name, "path": path}


def add_lora_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LoRA serving")
    g.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=[], metavar="NAME=PATH",
                   help="adapters served from the start (needs --enable-lora): name=path or a JSON object "
                        "{\"name\", \"path\", \"base_model_name\"}; a request's model names one")
    g.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help=f"serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also ${RUNTIME_UPDATING_ENV})")


def runtime_updating_allowed(flag: bool) -> bool:
    """The flag, or vLLM's environment variable set true."""
    return flag or os.environ.get(RUNTIME_UPDATING_ENV, "").strip().lower() in _TRUE


class LoRAServing:
    """The served adapters (by name, on ``ctx.loras``) and their routes."""

    def __init__(self, ctx: ServingContext, engine: AsyncLLMEngine, enabled: bool, allow_updating: bool,
                 modules: list[dict]) -> None:
        self.ctx, self.engine, self.enabled, self.allow_updating = ctx, engine, enabled, allow_updating
        self._ids = itertools.count(1)
        if modules and not enabled:
            raise ValueError("--lora-modules needs --enable-lora")
        for spec in modules:
            if spec["name"] in ctx.loras or spec["name"] in ctx.model_names:
                raise ValueError(f"--lora-modules: the name {spec['name']!r} is used twice")
            ctx.loras[spec["name"]] = LoRARequest(spec["name"], next(self._ids), spec["path"],
                                                  spec.get("base_model_name"))

    async def check_start_modules(self) -> None:
        """Loads the start-up adapters in the engine: a bad one stops the server with its reason."""
        for request in self.ctx.loras.values():
            await self.engine.update_lora(request, load=True)

    def model_cards(self, root: str) -> list[dict]:
        return [{"id": name, "object": "model", "created": now_s(), "owned_by": "folovllm", "root": lora.lora_path,
                 "parent": lora.base_model_name or self.ctx.model_name, "max_model_len": self.ctx.max_model_len}
                for name, lora in self.ctx.loras.items()]

    def _check_allowed(self) -> None:
        if not self.enabled:
            raise APIError(400, "LoRA is off: start the server with --enable-lora")
        if not self.allow_updating:
            raise APIError(400, "loading and unloading adapters at run time is off: start the server with "
                                f"--allow-runtime-lora-updating (or {RUNTIME_UPDATING_ENV}=true)")

    async def load(self, body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        self._check_allowed()
        if body.lora_name in self.ctx.loras or body.lora_name in self.ctx.model_names:
            raise APIError(400, f"the LoRA adapter {body.lora_name!r} is already loaded", param="lora_name")
        request = LoRARequest(body.lora_name, next(self._ids), body.lora_path)
        try:
            await self.engine.update_lora(request, load=True)
        except ValueError as err:
            raise bad_request(err, param="lora_path") from err
        except EngineError as err:
            raise engine_error(err) from err
        self.ctx.loras[body.lora_name] = request
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload(self, body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        self._check_allowed()
        request = self.ctx.loras.get(body.lora_name)
        if request is None:
            raise APIError(404, f"the LoRA adapter {body.lora_name!r} cannot be found", type="not_found_error",
                           param="lora_name", code="lora_not_found")
        del self.ctx.loras[body.lora_name]  # new requests stop naming it; running ones finish with it
        try:
            await self.engine.update_lora(request, load=False)
        except EngineError as err:
            raise engine_error(err) from err
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    def router(self) -> APIRouter:
        """The load and unload routes; in /openapi.json only where they can succeed (else each is a 400)."""
        router = APIRouter(include_in_schema=self.enabled and self.allow_updating)
        router.add_api_route("/load_lora_adapter", self.load, methods=["POST"], response_class=Response,
                             responses=TEXT_OK)
        router.add_api_route("/unload_lora_adapter", self.unload, methods=["POST"], response_class=Response,
                             responses=TEXT_OK)
        return router
