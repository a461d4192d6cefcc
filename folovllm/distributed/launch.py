"""Rank processes on one machine: a rendezvous store on a free loopback port, spawned ranks, their ends.

The store's port is picked by the OS (port 0), so two engines on one machine never collide. A rank is
a fresh interpreter (``python -m <module> <fd>``; CUDA and OpenMP do not survive fork) started with
``subprocess``, which works from the server's engine-core process too (multiprocessing forbids a
daemon process children). It talks to rank 0 over one socket pair, so it reads EOF as soon as rank 0's
process is gone, however it died, and exits: no orphans.
"""
from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

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
    """A process's end in words: 'killed by SIGKILL', 'exit code 1' ('exit status unknown' while it
    is not reaped)."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


@dataclass
class RankProcess:
    """A spawned rank: its process and rank 0's end of the connection to it."""

    rank: int
    process: subprocess.Popen
    conn: Connection

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout_s: float) -> None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def describe(self) -> str:
        """'rank 1 (pid 123) killed by SIGKILL'."""
        self.join(0.5)  # a rank that just died may not be reaped yet
        return f"rank {self.rank} (pid {self.process.pid}) {describe_exit(self.process.returncode)}"

    def stop(self, timeout_s: float) -> None:
        """Closes the connection (the rank reads EOF and exits), then waits; terminates it past ``timeout_s``."""
        self.conn.close()
        self.join(timeout_s)
        if self.is_alive():
            self.process.terminate()
            self.join(timeout_s)
        if self.is_alive():
            self.process.kill()
            self.process.wait()


def spawn_rank(module: str, rank: int) -> RankProcess:
    """Starts ``python -m module <fd>``: ``fd`` is the rank's end of a socket pair to this process.

    The child sees this interpreter's ``sys.path``, so it imports the same ``folovllm``.
    """
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    process = subprocess.Popen([sys.executable, "-m", module, str(theirs.fileno())],
                               pass_fds=(theirs.fileno(),), env=env)
    theirs.close()  # the rank holds the only other end: EOF here means it is gone
    return RankProcess(rank, process, Connection(ours.detach()))


def rank_connection(argv: list[str]) -> Connection:
    """In a spawned rank: its connection to rank 0, from the fd ``spawn_rank`` put on its command line."""
    if len(argv) != 2 or not argv[1].isdigit():
        raise SystemExit(f"usage: python -m {argv[0]} <fd>  (started by rank 0, not by hand)")
    return Connection(int(argv[1]))
