"""The KV connector interface: how one instance's KV blocks reach another (prefill/decode disaggregation).

A connector has two sides, built from the same class with a role:

- scheduler side (in the engine, beside the scheduler): decides which prompt tokens arrive from
  elsewhere (``get_num_new_matched_tokens``), learns the blocks allocated for them
  (``update_state_after_alloc``), says whether a finished request's blocks are held for a consumer
  and what to tell it (``request_finished``), and packs each step's orders into plain data
  (``build_connector_meta``);
- worker side (beside the KV tensors): carries out those orders (``start_load_kv``, ``save_kv``) and
  reports the transfers that ended (``get_finished``).

A producer (``kv_producer``) prefills, samples one token and holds the request's blocks until the
consumer has them (or a timeout); a consumer (``kv_consumer``) loads them into blocks of its own and
computes only the prompt's last token. Whole requests move once their prefill is done.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from folovllm.registry import Registry
from folovllm.request import Request

logger = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (K, V), [num_blocks, block_size, heads, dim]
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class ConnectorSide(enum.Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


@dataclass(frozen=True)
class KVTransferSettings:
    """What every connector reads from the engine config (resolved there)."""

    role: str  # one of KV_ROLES
    engine_id: str  # names this instance in the params it hands out
    block_size: int
    timeout_s: float  # a producer frees held blocks after this; a consumer gives up a pull after it
    storage_path: str = ""  # shared_storage: the folder both instances see
    host: str = "127.0.0.1"  # torch_distributed: the address a producer listens on and advertises
    port: int = 0  # torch_distributed: 0 = a free port
    # torch_distributed consumer: KV bytes the engine thread copies from staging into the cache per
    # step (at least one layer's K and V); 0 = each arrival whole, in the step that sees it
    load_copy_bytes_per_step: int = 0


@dataclass
class LoadSpec:
    """One request's KV to fetch: the producer's params and this instance's blocks to fill."""

    request_id: str
    params: dict[str, Any]
    block_ids: list[int]  # this instance's blocks for tokens [first_token, first_token + num_tokens)
    first_block: int  # the index, in the request's block table, of block_ids[0]
    num_tokens: int


@dataclass
class SaveSpec:
    """One finished request's KV to hand out: its blocks, held until the transfer ends."""

    transfer_id: str
    block_ids: list[int]
    num_tokens: int


@dataclass
class KVConnectorMetadata:
    """One step's orders from the scheduler side to the worker side (plain data: it pickles)."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    cancelled_loads: list[str] = field(default_factory=list)  # aborted while waiting: never write their blocks

    @property
    def is_empty(self) -> bool:
        return not (self.loads or self.saves or self.cancelled_loads)


@dataclass
class KVTransferResult:
    """What the worker side reports after a step: transfers that ended since the last report."""

    finished_sending: set[str] = field(default_factory=set)  # transfer ids: their held blocks may go
    finished_recving: set[str] = field(default_factory=set)  # request ids: their KV is in place
    failed_recving: set[str] = field(default_factory=set)  # request ids: recompute the prefill locally
    recv_bytes: int = 0  # KV bytes of the finished receives
    recv_seconds: float = 0.0  # their summed time, from asking for the KV to having it in place


class KVConnectorBase:
    """Both sides of a connector; subclasses override what their transport needs.

    The defaults implement the scheduler side's bookkeeping for whole-request transfers, so a
    transport writes only its worker side and the fields it adds to the params.
    """

    name = "base"

    def __init__(self, settings: KVTransferSettings, side: ConnectorSide) -> None:
        if settings.role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {KV_ROLES}; got {settings.role!r}")
        self.settings = settings
        self.side = side
        self._pending = KVConnectorMetadata()  # scheduler side: orders for the next step
        self._handshake: dict[str, Any] = {}  # scheduler side: the worker side's handshake metadata

    @property
    def is_producer(self) -> bool:
        return self.settings.role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.settings.role in ("kv_consumer", "kv_both")

    # -- scheduler side ---------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Prompt tokens past ``num_computed_tokens`` (local prefix hits) that another instance
        provides, and whether they arrive asynchronously. All but the prompt's last token, whose
        logits this instance needs; 0 when the request carries no usable params."""
        params = request.kv_transfer_params
        if not self.is_consumer or not params or not params.get("do_remote_prefill"):
            return 0, False
        reason = self.check_remote_params(request, params)
        if reason is not None:
            logger.warning("request %s: %s; computing its prefill locally", request.request_id, reason)
            params["do_remote_prefill"] = False
            return 0, False
        return max(0, request.num_prompt_tokens - 1 - num_computed_tokens), True

    def check_remote_params(self, request: Request, params: dict[str, Any]) -> str | None:
        """Why the producer's params cannot serve this request, or None when they can."""
        if params.get("connector") != self.name:
            return f"kv_transfer_params come from connector {params.get('connector')!r}, this is {self.name!r}"
        if params.get("block_size") != self.settings.block_size:
            return (f"the producer's block_size {params.get('block_size')} differs from this "
                    f"instance's {self.settings.block_size}")
        if params.get("num_prompt_tokens") != request.num_prompt_tokens:
            return (f"kv_transfer_params are for {params.get('num_prompt_tokens')} prompt tokens, "
                    f"the request has {request.num_prompt_tokens}")
        if request.needs_prompt_logprobs:
            return "prompt logprobs need every prompt token computed here"
        return None

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_local_tokens: int,
                                 num_external_tokens: int) -> None:
        """The request holds ``block_ids`` (its whole table): queue the load of the external tokens."""
        params = dict(request.kv_transfer_params or {})
        request.kv_transfer_params["do_remote_prefill"] = False  # one attempt; a failure recomputes
        first_block = num_local_tokens // self.settings.block_size
        end_block = -(-(num_local_tokens + num_external_tokens) // self.settings.block_size)
        self._pending.loads.append(LoadSpec(request.request_id, params, block_ids[first_block:end_block],
                                            first_block, num_external_tokens))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Whether the finished request's blocks are held for a consumer, and the params the
        consumer needs (returned to the client). Only a request that asked (``do_remote_decode``)
        and ended normally is held."""
        params = request.kv_transfer_params
        if not self.is_producer or not params or not params.get("do_remote_decode") or not block_ids:
            return False, None
        if request.status.value not in ("stop", "length"):
            return False, None
        transfer_id = f"{self.settings.engine_id}-{request.request_id}-{request.arrival_seq}"
        num_tokens = request.num_prompt_tokens
        self._pending.saves.append(SaveSpec(transfer_id, list(block_ids), num_tokens))
        return True, {"do_remote_prefill": True, "do_remote_decode": False, "connector": self.name,
                      "remote_engine_id": self.settings.engine_id, "remote_request_id": transfer_id,
                      "remote_block_ids": list(block_ids), "num_prompt_tokens": num_tokens,
                      "block_size": self.settings.block_size, **self.advertised_params()}

    def set_handshake_metadata(self, metadata: dict[str, Any]) -> None:
        """The worker side's ``handshake_metadata`` (e.g. the address it listens on)."""
        self._handshake = dict(metadata)

    def advertised_params(self) -> dict[str, Any]:
        """What a consumer needs to reach this producer (the worker side's handshake metadata),
        added to every params handed out."""
        return dict(self._handshake)

    def request_aborted_while_loading(self, request_id: str) -> None:
        """The request ended while its KV was on the way: its blocks must never be written."""
        self._pending.cancelled_loads.append(request_id)

    def build_connector_meta(self) -> KVConnectorMetadata:
        """The orders gathered since the last step; the scheduler side starts a fresh batch."""
        meta, self._pending = self._pending, KVConnectorMetadata()
        return meta

    # -- worker side ------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        """The worker's KV tensors, which loads fill and saves read."""
        self.kv_caches = kv_caches

    def handshake_metadata(self) -> dict[str, Any]:
        """What the scheduler side advertises for this worker side (after ``register_kv_caches``)."""
        return {}

    def start_load_kv(self, meta: KVConnectorMetadata) -> None:
        """Starts fetching the loads of ``meta`` (and forgets cancelled ones)."""
        raise NotImplementedError

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        """Hands out the saves of ``meta`` (their blocks stay held until reported finished)."""
        raise NotImplementedError

    def get_finished(self) -> KVTransferResult:
        """Transfers that ended since the last call."""
        raise NotImplementedError

    def close(self) -> None:
        """Stops background threads and listeners, if any."""


KV_CONNECTORS: Registry[type[KVConnectorBase]] = Registry("KV connector")
# vLLM's class names for the connectors that behave like theirs
KV_CONNECTOR_ALIASES = {"SharedStorageConnector": "shared_storage"}


def kv_connector_names() -> list[str]:
    _import_builtin_connectors()
    return KV_CONNECTORS.names() + list(KV_CONNECTOR_ALIASES)


def make_kv_connector(name: str, settings: KVTransferSettings, side: ConnectorSide) -> KVConnectorBase:
    """The connector registered as ``name`` (or a vLLM alias of it), for one side."""
    _import_builtin_connectors()
    return KV_CONNECTORS.get(KV_CONNECTOR_ALIASES.get(name, name))(settings, side)


def _import_builtin_connectors() -> None:
    from folovllm.kv_transfer import shared_storage, torch_distributed  # noqa: F401  (they register)
