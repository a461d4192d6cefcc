"""Rank processes on one machine: a rendezvous store on a free loopback port, spawned ranks, their ends.

The store's port is picked by the OS (port 0), so two engines on one machine never collide. Ranks are
spawned (CUDA and OpenMP do not survive fork) as daemons of the process that owns rank 0.
"""
from __future__ import annotations

import datetime
import multiprocessing
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch.distributed as dist

LOOPBACK = "127.0.0.1"
# Joining waits for every rank to start its interpreter and import torch, on a loaded machine too.
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=5)


class RankFailedError(RuntimeError):
    """A rank of the tensor-parallel group died or failed: the group cannot run another step."""


def rendezvous_store(world_size: int) -> dist.TCPStore:
    """The store rank 0 hosts, on a port the OS picks (read it from ``store.port``)."""
    return dist.TCPStore(LOOPBACK, 0, world_size, True, timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False)


def connect_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    """A client of the rendezvous store at ``host:port``."""
    return dist.TCPStore(host, port, world_size, False, timeout=RENDEZVOUS_TIMEOUT)


def describe_exit(exitcode: int | None) -> str:
    """A process's end in words: 'killed by SIGKILL', 'exit code 1', 'still running'."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


@dataclass
class RankProcess:
    """A spawned rank: its process and rank 0's end of the pipe to it."""

    rank: int
    process: multiprocessing.process.BaseProcess
    conn: Connection

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def describe(self) -> str:
        """'rank 1 (pid 123) killed by SIGKILL'."""
        self.process.join(0.5)  # a rank that just died may not be reaped yet
        return f"rank {self.rank} (pid {self.process.pid}) {describe_exit(self.process.exitcode)}"

    def stop(self, timeout_s: float) -> None:
        """Closes the pipe (the rank reads EOF and exits), then waits; terminates it past ``timeout_s``."""
        self.conn.close()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def spawn_rank(target: Callable[..., None], rank: int, args: tuple[Any, ...]) -> RankProcess:
    """Starts ``target(*args, conn)`` in a spawned daemon process; ``conn`` is its end of a duplex pipe."""
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(target=target, name=f"folovllm-tp-rank{rank}", args=(*args, child_conn), daemon=True)
    process.start()
    child_conn.close()  # the rank holds the only other end: EOF here means it is gone
    return RankProcess(rank, process, parent_conn)
