"""A request's LoRA adapter, with vLLM's names: plain, picklable data that crosses to the worker."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """One adapter: ``lora_name`` (what a server request's ``model`` names), ``lora_int_id`` (unique per
    adapter, >= 1), ``lora_path`` (a PEFT folder: adapter_config.json + adapter_model.safetensors)."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None  # the model the server lists as the adapter's parent

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("a LoRARequest needs a non-empty lora_name")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1; got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r} needs a lora_path")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path

    def cache_key(self) -> bytes:
        """What the prefix cache mixes into a block's hash: blocks computed under one adapter are never
        found by another (or by the base model)."""
        return f"|lora:{self.lora_int_id}:{self.lora_name}:{self.lora_path}".encode()
