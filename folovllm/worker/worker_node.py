"""A machine other than node 0 (``--node-rank R >= 1``): it runs no engine, only its tensor-parallel ranks.

It finds node 0's rendezvous store, connects one socket per local rank to rank 0's step listener,
starts the ranks on them (worker/rank_main.py) and waits until they exit: they do when rank 0 closes
their connections (the engine stopped or died), or when one fails (rank 0 then stops the rest).
"""
from __future__ import annotations

import signal
import subprocess
import sys
from types import FrameType

from folovllm.config import EngineConfig
from folovllm.distributed.launch import RENDEZVOUS_TIMEOUT, connect_store, describe_exit, start_rank_process
from folovllm.distributed.nodes import connect_to_first
from folovllm.model.loader import default_model_path
from folovllm.model.loader.hub import resolve_model_files

RANK_MAIN = "folovllm.worker.rank_main"


def _say(text: str) -> None:
    print(f"node: {text}", file=sys.stderr, flush=True)


def run_worker_node(config: EngineConfig) -> int:
    """Starts this node's ranks and waits for them; the exit status: 0 when every rank ended cleanly,
    1 when one failed or node 0 could not be reached."""
    if config.node_rank == 0:
        raise ValueError("node 0 runs the engine: run_worker_node is for --node-rank >= 1")
    config = resolve_model_files(config)  # this machine's copy of the model (hub ids looked up here)
    model_path = config.model or default_model_path()
    num_threads = config.resolve().num_threads
    per_node = config.ranks_per_node
    ranks = range(config.node_rank * per_node, (config.node_rank + 1) * per_node)
    address = f"{config.master_addr}:{config.master_port}"
    _say(f"node {config.node_rank} of {config.nnodes}: tensor-parallel ranks {ranks[0]}..{ranks[-1]} of "
         f"{config.tensor_parallel_size}, model {model_path}; waiting for node 0's rendezvous at {address} "
         f"(up to {RENDEZVOUS_TIMEOUT.total_seconds():.0f} s)")
    try:
        store = connect_store(config.master_addr, config.master_port, config.tensor_parallel_size)
        sockets = [connect_to_first(store, rank) for rank in ranks]
    except (RuntimeError, OSError) as err:  # torch's store errors are RuntimeErrors
        _say(f"error: cannot join node 0 at {address}: {err}; is node 0 started with the same "
             "--master-addr/--master-port, and can this machine reach that address?")
        return 1
    processes = [start_rank_process(RANK_MAIN, sock, ("--model-path", model_path, "--num-threads", str(num_threads)))
                 for sock in sockets]
    _say("started " + ", ".join(f"rank {r} (pid {p.pid})" for r, p in zip(ranks, processes))
         + "; they exit when node 0's engine stops")
    return _wait(dict(zip(ranks, processes)))


def _wait(processes: dict[int, subprocess.Popen]) -> int:
    """Waits for every rank; SIGTERM or SIGINT here is passed on to them."""
    def stop(signum: int, frame: FrameType | None) -> None:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = 0
        for rank, process in processes.items():
            code = process.wait()
            _say(f"rank {rank} (pid {process.pid}) ended: {describe_exit(code)}")
            status = status or int(code != 0)
        return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
