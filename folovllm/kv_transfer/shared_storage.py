"""``shared_storage``: the producer writes a request's KV blocks to a folder both instances see, the
consumer reads them back. One safetensors file per request (K and V of every layer), written
before the producer's response leaves, so the consumer finds it; the consumer deletes it once read.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from folovllm.kv_transfer.base import (
    KV_CONNECTORS,
    ConnectorSide,
    KVConnectorBase,
    KVConnectorMetadata,
    KVTransferResult,
    KVTransferSettings,
    LoadSpec,
)

logger = logging.getLogger(__name__)


@KV_CONNECTORS.register("shared_storage")
class SharedStorageConnector(KVConnectorBase):
    name = "shared_storage"

    def __init__(self, settings: KVTransferSettings, side: ConnectorSide) -> None:
        if not settings.storage_path:
            raise ValueError("the shared_storage KV connector needs a folder: "
                             "--kv-transfer-config '{\"kv_connector_extra_config\": {\"shared_storage_path\": DIR}}'")
        super().__init__(settings, side)
        self.root = Path(settings.storage_path)
        self._result = KVTransferResult()

    def request_folder(self, transfer_id: str) -> Path:
        """Where one request's KV lives (hashed: a request id may hold any character)."""
        return self.root / hashlib.sha256(transfer_id.encode()).hexdigest()[:32]

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        for save in meta.saves:
            folder = self.request_folder(save.transfer_id)
            folder.mkdir(parents=True, exist_ok=True)
            index = torch.tensor(save.block_ids, dtype=torch.long, device=self.kv_caches[0][0].device)
            tensors = {}
            for layer, (k, v) in enumerate(self.kv_caches):
                tensors[f"k.{layer}"] = k.index_select(0, index).cpu()
                tensors[f"v.{layer}"] = v.index_select(0, index).cpu()
            partial = folder / "kv.safetensors.partial"
            save_file(tensors, str(partial))
            os.replace(partial, folder / "kv.safetensors")  # a reader never sees half a file
            self._result.finished_sending.add(save.transfer_id)  # on disk: the blocks may go

    def start_load_kv(self, meta: KVConnectorMetadata) -> None:
        for load in meta.loads:
            started = time.monotonic()
            try:
                self._result.recv_bytes += self._load(load)
            except Exception as err:  # a missing or foreign file: the request recomputes
                logger.warning("request %s: loading its KV from %s failed (%s)", load.request_id,
                               self.root, err)
                self._result.failed_recving.add(load.request_id)
                continue
            self._result.recv_seconds += time.monotonic() - started
            self._result.finished_recving.add(load.request_id)

    def _load(self, load: LoadSpec) -> int:
        """Copies the request's blocks from its file into the cache; returns the bytes read."""
        folder = self.request_folder(load.params["remote_request_id"])
        device = self.kv_caches[0][0].device
        target = torch.tensor(load.block_ids, dtype=torch.long, device=device)
        num_bytes = 0
        blocks = slice(load.first_block, load.first_block + len(load.block_ids))
        with safe_open(str(folder / "kv.safetensors"), framework="pt") as f:
            if len(f.keys()) != 2 * len(self.kv_caches):
                raise ValueError(f"the file holds {len(f.keys()) // 2} layers, this model has {len(self.kv_caches)}")
            for layer, (k, v) in enumerate(self.kv_caches):
                for name, cache in ((f"k.{layer}", k), (f"v.{layer}", v)):
                    stored = f.get_slice(name)[blocks]
                    if stored.shape[1:] != cache.shape[1:] or stored.shape[0] != len(load.block_ids) \
                            or stored.dtype != cache.dtype:
                        raise ValueError(f"{name} is {stored.dtype} {tuple(stored.shape)}, this cache's "
                                         f"blocks are {cache.dtype} {tuple(cache.shape[1:])}")
                    # as bytes: index_copy_ has no float8 kernel (a quantized cache's rows and scales)
                    cache.view(torch.uint8).index_copy_(0, target, stored.to(device).view(torch.uint8))
                    num_bytes += stored.nbytes
        shutil.rmtree(folder, ignore_errors=True)  # read once: nothing else will ask for it
        return num_bytes

    def get_finished(self) -> KVTransferResult:
        result, self._result = self._result, KVTransferResult()
        return result
