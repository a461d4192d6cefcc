"""Tensor parallelism across machines: how rank 0 and the ranks on other nodes find each other.

Rank 0 listens for the step hand-off on node 0's address (``--master-addr``) at a port the OS picks and
publishes that address in the rendezvous store. A rank on node R >= 1 reads it there, connects and says
which rank it is; rank 0 accepts exactly the ranks it expects, within a timeout whose error names the
ranks still missing. The connection then carries what a local rank's socket pair carries
(channel.py), so EOF means the other end's process is gone, on either side; keepalive probes turn a
machine that vanished without closing its sockets (power, network) into the same EOF.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch.distributed as dist

from folovllm.distributed.launch import RankFailedError, listen_on

logger = logging.getLogger(__name__)

STEP_LISTENER_KEY = "folovllm/step_listener"
# What a rank writes first on its connection: a fixed tag (anything else is not a rank) and its rank.
_HELLO = struct.Struct("!8sI")
_HELLO_TAG = b"folovllm"
_HELLO_TIMEOUT_S = 10.0
# A peer silent this long is probed; after the probes go unanswered its connection reads as closed.
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_PROBES = 30, 10, 3


def gloo_address(master_addr: str, nnodes: int) -> str | None:
    """The address gloo should listen on across machines: this machine's end of the route to node 0
    (a peer can reach it, where the hostname may resolve to loopback). None on one machine, or when
    ``GLOO_SOCKET_IFNAME`` names the interface."""
    if nnodes == 1 or os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    family, _, _, _, address = socket.getaddrinfo(master_addr, 1, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", _KEEPALIVE_PROBES)):
        if hasattr(socket, name):  # Linux names; elsewhere the system's defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


@dataclass
class RemoteRank:
    """A rank on another node as rank 0 sees it: only its connection (its process belongs to that node,
    so its exit code is unknown here)."""

    rank: int
    conn: Connection
    peer: str

    def is_alive(self) -> bool:
        """False once the connection is closed: after start-up a rank sends nothing, so anything to read
        is the end of its connection."""
        if self.conn.closed:
            return False
        try:
            return not self.conn.poll(0)
        except OSError:
            return False

    def describe(self) -> str:
        """'rank 1 (10.0.0.2:51234) connection lost'."""
        return f"rank {self.rank} ({self.peer}) connection lost"

    def stop(self, timeout_s: float) -> None:
        """Closes the connection: the rank reads EOF and exits (its node waits for it, not rank 0)."""
        self.conn.close()


class StepListener:
    """Rank 0's listener for the ranks of other nodes, on ``host`` at a port the OS picks."""

    def __init__(self, host: str) -> None:
        self._sock = listen_on(host, 0)
        self.address = f"{host}:{self._sock.getsockname()[1]}"

    def publish(self, store: dist.Store) -> None:
        """Puts this listener's address in the store, where the other nodes' ranks look for it."""
        store.set(STEP_LISTENER_KEY, self.address)

    def accept_ranks(self, expected: Iterable[int], timeout_s: float, hint: str = "") -> list[RemoteRank]:
        """One connection from each expected rank (in rank order). A connection that is no expected
        rank's is turned away; RankFailedError naming the missing ranks (then ``hint``) past ``timeout_s``."""
        missing = set(expected)
        accepted: dict[int, RemoteRank] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while missing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RankFailedError(
                        f"tensor-parallel rank(s) {', '.join(map(str, sorted(missing)))} did not connect to "
                        f"{self.address} within {timeout_s:.0f} s{hint}")
                self._sock.settimeout(remaining)
                try:
                    sock, peer = self._sock.accept()
                except TimeoutError:
                    continue
                peer_text = f"{peer[0]}:{peer[1]}"
                rank = _read_hello(sock)
                if rank not in missing:
                    logger.warning("turned away a connection from %s: %s", peer_text,
                                   "not a rank" if rank is None else f"rank {rank} is not expected (again?)")
                    sock.close()
                    continue
                sock.settimeout(None)
                _keepalive(sock)
                accepted[rank] = RemoteRank(rank, Connection(sock.detach()), peer_text)
                missing.discard(rank)
                logger.info("tensor-parallel rank %d connected from %s", rank, peer_text)
        except BaseException:
            for remote in accepted.values():
                remote.conn.close()
            raise
        finally:
            self.close()
        return [accepted[rank] for rank in sorted(accepted)]

    def close(self) -> None:
        self._sock.close()


def _read_hello(sock: socket.socket) -> int | None:
    """The rank a new connection says it is; None if it does not say so in time."""
    sock.settimeout(_HELLO_TIMEOUT_S)
    data = b""
    try:
        while len(data) < _HELLO.size:
            chunk = sock.recv(_HELLO.size - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    tag, rank = _HELLO.unpack(data)
    return rank if tag == _HELLO_TAG else None


def connect_to_first(store: dist.Store, rank: int, timeout_s: float = 60.0) -> socket.socket:
    """On node R >= 1: ``rank``'s connection to rank 0's listener (its address read from ``store``,
    which waits until rank 0 has published it)."""
    host, _, port = store.get(STEP_LISTENER_KEY).decode().rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.sendall(_HELLO.pack(_HELLO_TAG, rank))
    sock.settimeout(None)
    _keepalive(sock)
    return sock
