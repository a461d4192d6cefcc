"""Rank processes: a rendezvous store bound to one address, spawned ranks, their ends.

On one machine the store's port is picked by the OS (port 0) on loopback, so two engines on one
machine never collide; across machines it listens on the address and port every node is given. A rank is
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


def listen_on(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only, not on every interface (port 0: the OS picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def rendezvous_store(world_size: int, host: str = LOOPBACK, port: int = 0) -> dist.TCPStore:
    """The store rank 0 hosts, listening on ``host:port`` only (port 0: the OS picks one; read it from
    ``store.port``)."""
    listener = listen_on(host, port)
    try:
        return dist.TCPStore(host, listener.getsockname()[1], world_size, True, timeout=RENDEZVOUS_TIMEOUT,
                             wait_for_workers=False, master_listen_fd=listener.detach())
    except BaseException:
        listener.close()
        raise


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


def start_rank_process(module: str, sock: socket.socket, args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Starts ``python -m module <fd> *args`` where ``fd`` is ``sock``, then closes this process's copy of
    it (the rank holds the only end here, so its death closes the connection).

    The child sees this interpreter's ``sys.path``, so it imports the same ``folovllm``.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        return subprocess.Popen([sys.executable, "-m", module, str(sock.fileno()), *args],
                                pass_fds=(sock.fileno(),), env=env)
    finally:
        sock.close()


def spawn_rank(module: str, rank: int) -> RankProcess:
    """Starts a rank on this machine, on one end of a socket pair whose other end this process keeps."""
    ours, theirs = socket.socketpair()
    process = start_rank_process(module, theirs)
    return RankProcess(rank, process, Connection(ours.detach()))


def rank_connection(argv: list[str]) -> Connection:
    """In a spawned rank: its connection to rank 0, from the fd ``start_rank_process`` put first on its
    command line."""
    if len(argv) < 2 or not argv[1].isdigit():
        raise SystemExit(f"usage: python -m {argv[0]} <fd> ...  (started by rank 0 or a node's launcher, "
                         "not by hand)")
    return Connection(int(argv[1]))
