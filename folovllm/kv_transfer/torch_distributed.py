"""``torch_distributed``: KV blocks move point to point over torch.distributed (gloo), one 2-rank
process group per producer–consumer pair, built from a store (no global default group).

The producer's worker hosts a TCPStore (a free port unless ``kv_port`` is set); its address goes
into every kv_transfer_params it hands out. A consumer that needs a producer for the first time
joins that store, takes a pair number, and both sides build a ``ProcessGroupGloo`` over a
``PrefixStore`` named after the pair (rank 0 the producer, rank 1 the consumer). Per request, the
consumer posts its ask in the store; the producer's thread for the pair answers, then sends the
held blocks layer by layer (K, then V, each gathered into one tensor); the consumer receives them
into staging tensors and acknowledges in the store, and the producer reports the transfer done,
so the engine frees the blocks. The consumer's engine thread copies staged blocks into its cache,
so no background thread writes a block the engine might be reusing, a few layers per step
(``load_copy_bytes_per_step``) so that no decode step pays for a whole long prompt's KV.
"""
from __future__ import annotations

import datetime
import json
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from folovllm.kv_transfer.base import (
    KV_CONNECTORS,
    ConnectorSide,
    KVConnectorBase,
    KVConnectorMetadata,
    KVTransferResult,
    KVTransferSettings,
    LoadSpec,
)
from folovllm.request import Request

logger = logging.getLogger(__name__)

POLL_S = 0.02  # how often a waiting thread looks at the store (and whether the connector stopped)
REGISTRATION_WAIT_S = 10.0  # a consumer may ask before the producer's engine has registered the hold
MAX_COPY_STEPS = 8  # a consumer's copy budget grows so that arrived KV is in place within this many steps


def _layout(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Any]:
    """What both sides must share for blocks to be copied as they are."""
    k = kv_caches[0][0]
    return [len(kv_caches), *k.shape[1:], str(k.dtype).removeprefix("torch.")]


@dataclass
class _Hold:
    block_ids: list[int]
    deadline: float
    sending: bool = False


@dataclass
class _Pair:
    """The consumer's end of one producer pair: its store client and process group."""

    store: dist.Store
    group: dist.ProcessGroup
    number: int
    next_seq: int = 0


@dataclass
class _Arrival:
    load: LoadSpec
    staged: list[tuple[torch.Tensor, torch.Tensor]] | None  # None: the pull failed
    error: str = ""
    started: float = 0.0  # time.monotonic() when the pull asked the producer
    copied: int = 0  # layers already copied from staging into the cache
    copy_by: int = 0  # the consumer's copy call by which every layer must be in place


@KV_CONNECTORS.register("torch_distributed")
class TorchDistributedConnector(KVConnectorBase):
    name = "torch_distributed"

    def __init__(self, settings: KVTransferSettings, side: ConnectorSide) -> None:
        super().__init__(settings, side)
        self._timeout = datetime.timedelta(seconds=settings.timeout_s)
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._holds: dict[str, _Hold] = {}  # producer: transfer id -> held blocks
        self._sent: set[str] = set()  # producer: transfers ended since the last report
        self._arrivals: queue.Queue[_Arrival] = queue.Queue()  # consumer: pulls ended
        self._cancelled: set[str] = set()
        self._copying: list[_Arrival] = []  # consumer: arrived, being copied into the cache (engine thread)
        self._copy_calls = 0
        self._pairs: dict[tuple[str, int], _Pair] = {}
        self._pullers: dict[tuple[str, int], ThreadPoolExecutor] = {}  # one thread per producer: asks in order
        self._store: dist.TCPStore | None = None
        self._threads: list[threading.Thread] = []

    # -- scheduler side ---------------------------------------------------------------------------

    def check_remote_params(self, request: Request, params: dict[str, Any]) -> str | None:
        reason = super().check_remote_params(request, params)
        if reason is None and not (isinstance(params.get("remote_host"), str)
                                   and isinstance(params.get("remote_port"), int)):
            reason = "kv_transfer_params lack the producer's remote_host and remote_port"
        if reason is None and params.get("kv_layout") != self._handshake.get("kv_layout"):
            reason = (f"the producer's KV layout {params.get('kv_layout')} differs from this instance's "
                      f"{self._handshake.get('kv_layout')}")
        return reason

    # -- worker side: start-up ----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().register_kv_caches(kv_caches)
        if self.is_producer:
            self._store = dist.TCPStore(self.settings.host, self.settings.port, is_master=True,
                                        wait_for_workers=False, timeout=self._timeout)
            self._start(self._listen, "folovllm-kv-listen")

    def handshake_metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"kv_layout": _layout(self.kv_caches)}
        if self._store is not None:
            meta.update(remote_host=self.settings.host, remote_port=self._store.port)
        return meta

    def _start(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _client(self, host: str, port: int) -> dist.TCPStore:
        return dist.TCPStore(host, port, is_master=False, timeout=self._timeout)

    def _wait_key(self, store: dist.Store, key: str, timeout_s: float | None = None) -> bool:
        """Waits for ``key``; False once this connector stops or ``timeout_s`` passes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            if store.check([key]):
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            self._stop.wait(POLL_S)
        return False

    # -- worker side: producer ----------------------------------------------------------------------

    def _listen(self) -> None:
        """Accepts consumers, one pair number after another; each pair gets its own thread."""
        store = self._client(self.settings.host, self._store.port)
        number = 0
        while self._wait_key(store, f"pair/{number}/join"):
            self._start(self._serve_pair, f"folovllm-kv-send-{number}", number)
            number += 1

    def _serve_pair(self, number: int) -> None:
        store = self._client(self.settings.host, self._store.port)
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore(f"pair/{number}/pg", store), 0, 2, self._timeout)
        except Exception:
            logger.exception("KV transfer: pairing with consumer %d failed", number)
            return
        seq = 0
        while self._wait_key(store, f"pair/{number}/ask/{seq}"):
            ask = json.loads(store.get(f"pair/{number}/ask/{seq}"))
            try:
                if not self._send(store, group, number, seq, ask):
                    return
            finally:
                self._end_hold(ask["transfer_id"])
            seq += 1

    def _send(self, store: dist.Store, group: dist.ProcessGroup, number: int, seq: int, ask: dict) -> bool:
        """Answers one ask; False if the pair broke (the consumer recomputes; the thread ends)."""
        transfer_id = ask["transfer_id"]
        with self._lock:
            self._lock.wait_for(lambda: transfer_id in self._holds, REGISTRATION_WAIT_S)
            hold = self._holds.get(transfer_id)
            if hold is not None:
                hold.sending = True  # the timeout must not free blocks being read
        first, count = ask["first_block"], ask["num_blocks"]
        if hold is None or first + count > len(hold.block_ids):
            store.set(f"pair/{number}/reply/{seq}", "missing")
            return True
        store.set(f"pair/{number}/reply/{seq}", "ok")
        device = self.kv_caches[0][0].device
        index = torch.tensor(hold.block_ids[first:first + count], dtype=torch.long, device=device)
        try:
            for k, v in self.kv_caches:
                for cache in (k, v):
                    blocks = cache.index_select(0, index).cpu().contiguous()
                    group.send([blocks.view(torch.uint8)], 1, 0).wait()
            return self._wait_key(store, f"pair/{number}/ack/{seq}", self.settings.timeout_s)
        except Exception as err:
            logger.warning("KV transfer %s: sending failed (%s); the consumer recomputes", transfer_id, err)
            return False

    def _end_hold(self, transfer_id: str) -> None:
        with self._lock:
            if self._holds.pop(transfer_id, None) is not None:
                self._sent.add(transfer_id)

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        deadline = time.monotonic() + self.settings.timeout_s
        with self._lock:
            for save in meta.saves:
                self._holds[save.transfer_id] = _Hold(save.block_ids, deadline)
            self._lock.notify_all()

    # -- worker side: consumer ----------------------------------------------------------------------

    def start_load_kv(self, meta: KVConnectorMetadata) -> None:
        self._cancelled.update(meta.cancelled_loads)
        for load in meta.loads:
            address = (load.params["remote_host"], load.params["remote_port"])
            puller = self._pullers.get(address)
            if puller is None:
                puller = self._pullers[address] = ThreadPoolExecutor(1, thread_name_prefix="folovllm-kv-pull")
            puller.submit(self._pull, address, load)

    def _pull(self, address: tuple[str, int], load: LoadSpec) -> None:
        started = time.monotonic()
        try:
            staged = self._receive(address, load)
        except Exception as err:
            self._pairs.pop(address, None)  # a pair that failed midway cannot be trusted: pair again
            self._arrivals.put(_Arrival(load, None, f"{type(err).__name__}: {err}"))
            return
        self._arrivals.put(_Arrival(load, staged, started=started))

    def _pair(self, address: tuple[str, int]) -> _Pair:
        pair = self._pairs.get(address)
        if pair is None:
            store = self._client(*address)
            number = store.add("pairs", 1) - 1
            store.set(f"pair/{number}/join", "1")
            group = dist.ProcessGroupGloo(dist.PrefixStore(f"pair/{number}/pg", store), 1, 2, self._timeout)
            pair = self._pairs[address] = _Pair(store, group, number)
        return pair

    def _receive(self, address: tuple[str, int], load: LoadSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pair = self._pair(address)
        seq, pair.next_seq = pair.next_seq, pair.next_seq + 1
        prefix = f"pair/{pair.number}"
        ask = {"transfer_id": load.params["remote_request_id"], "first_block": load.first_block,
               "num_blocks": len(load.block_ids)}
        pair.store.set(f"{prefix}/ask/{seq}", json.dumps(ask))
        if not self._wait_key(pair.store, f"{prefix}/reply/{seq}", self.settings.timeout_s):
            raise TimeoutError(f"the producer at {address[0]}:{address[1]} did not answer")
        if pair.store.get(f"{prefix}/reply/{seq}") != b"ok":
            raise LookupError("the producer no longer holds this request's KV (timed out or unknown)")
        staged = []
        for k, v in self.kv_caches:
            layer = []
            for cache in (k, v):
                blocks = torch.empty((len(load.block_ids), *cache.shape[1:]), dtype=cache.dtype)
                pair.group.recv([blocks.view(torch.uint8)], 0, 0).wait()
                layer.append(blocks)
            staged.append((layer[0], layer[1]))
        pair.store.set(f"{prefix}/ack/{seq}", "1")
        return staged

    # -- worker side: both ------------------------------------------------------------------------

    def get_finished(self) -> KVTransferResult:
        result = KVTransferResult()
        while True:
            try:
                arrival = self._arrivals.get_nowait()
            except queue.Empty:
                break
            request_id = arrival.load.request_id
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
            elif arrival.staged is None:
                logger.warning("request %s: pulling its KV failed (%s)", request_id, arrival.error)
                result.failed_recving.add(request_id)
            else:
                arrival.copy_by = self._copy_calls + MAX_COPY_STEPS
                self._copying.append(arrival)
        self._copy_staged(result)
        now = time.monotonic()
        with self._lock:
            for transfer_id, hold in list(self._holds.items()):
                if not hold.sending and now > hold.deadline:
                    logger.warning("KV transfer %s: no consumer came within %.0f s; freeing its blocks",
                                   transfer_id, self.settings.timeout_s)
                    del self._holds[transfer_id]
                    self._sent.add(transfer_id)
            result.finished_sending, self._sent = self._sent, set()
        return result

    def _copy_staged(self, result: KVTransferResult) -> None:
        """Copies arrived KV from staging into the cache, on the engine thread, oldest arrival first:
        everything, or about ``load_copy_bytes_per_step`` (whole layers, at least one) so that no
        single step pays for a long prompt's KV; more when that is needed for every arrival to be in
        place within ``MAX_COPY_STEPS`` calls. A request whose KV is all in place is reported."""
        self._copy_calls += 1
        budget = float("inf")
        if self.settings.load_copy_bytes_per_step:
            due = sum((len(a.staged) - a.copied) * 2 * a.staged[0][0].nbytes / max(1, a.copy_by - self._copy_calls + 1)
                      for a in self._copying)
            budget = max(self.settings.load_copy_bytes_per_step, due)
        spent = 0
        while self._copying and spent < budget:
            arrival = self._copying[0]
            request_id = arrival.load.request_id
            if request_id in self._cancelled:  # aborted midway: its blocks may already serve another request
                self._cancelled.discard(request_id)
                self._copying.pop(0)
                continue
            device = self.kv_caches[0][0].device
            index = torch.tensor(arrival.load.block_ids, dtype=torch.long, device=device)
            while arrival.copied < len(arrival.staged) and spent < budget:
                (k, v), (sk, sv) = self.kv_caches[arrival.copied], arrival.staged[arrival.copied]
                # as bytes: index_copy_ has no float8 kernel, and a quantized cache's rows are bytes anyway
                k.view(torch.uint8).index_copy_(0, index, sk.to(device).view(torch.uint8))
                v.view(torch.uint8).index_copy_(0, index, sv.to(device).view(torch.uint8))
                spent += sk.nbytes + sv.nbytes
                arrival.copied += 1
            if arrival.copied < len(arrival.staged):
                break
            self._copying.pop(0)
            result.recv_bytes += sum(sk.nbytes + sv.nbytes for sk, sv in arrival.staged)
            result.recv_seconds += time.monotonic() - arrival.started
            result.finished_recving.add(request_id)

    def close(self) -> None:
        self._stop.set()
        for puller in self._pullers.values():
            puller.shutdown(wait=True, cancel_futures=True)
        for thread in self._threads:
            thread.join(timeout=5.0)
