"""A tensor-parallel rank other than 0: its own process, its slice of the model, no sampling.

It joins the group, loads its weights, says ready, then runs what rank 0 sends, in order: the two
start-up phases, then one step per message. It exits when rank 0's connection closes (rank 0 stops it
or is gone), or on any error (its peers' collectives then fail at once, and rank 0 reports it).

Its settings are rank 0's, so that every rank runs the same model the same way; a rank on another
machine takes from its own node only what differs there (``--model-path``, ``--num-threads``).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from multiprocessing.connection import Connection

from folovllm.config import EngineConfig
from folovllm.distributed.channel import receive
from folovllm.distributed.group import init_tp_group
from folovllm.distributed.launch import connect_store, rank_connection
from folovllm.distributed.nodes import gloo_address
from folovllm.platforms import platform_for
from folovllm.worker.step_input import StepInput
from folovllm.worker.worker import Worker

logger = logging.getLogger(__name__)

# Messages from rank 0 (the first item of each tuple).
STEP = "step"
DETERMINE_NUM_KV_BLOCKS = "determine_num_kv_blocks"
INITIALIZE_CACHE = "initialize_cache"


def node_settings(argv: list[str]) -> argparse.Namespace:
    """What this machine sets for a rank of another node (after the fd): its model path and CPU threads."""
    parser = argparse.ArgumentParser(prog="python -m folovllm.worker.rank_main <fd>")
    parser.add_argument("--model-path", help="the model on this machine (default: rank 0's path)")
    parser.add_argument("--num-threads", type=int, help="this machine's cores for its ranks (default: rank 0's)")
    return parser.parse_args(argv)


def run_rank(conn: Connection, node: argparse.Namespace) -> None:
    """The rank's main: its settings from rank 0 (``node``'s in their place where given), start-up (its
    error, if any, goes back over ``conn``), then the message loop."""
    config: EngineConfig
    config, model_path, rank, host, port, log_level = receive(conn)
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s (tp rank {rank}): %(message)s")
    model_path = node.model_path or model_path
    if node.num_threads is not None:
        config = dataclasses.replace(config, num_threads=node.num_threads)
    size = config.tensor_parallel_size
    try:
        store = connect_store(host, port, size)
        group = init_tp_group(store, rank, size, platform_for(config.torch_device).distributed_backend,
                              gloo_address(host, config.nnodes))
        worker = Worker(config, model_path, group)
    except Exception as err:
        logger.exception("start-up failed")
        conn.send(err)
        raise SystemExit(1) from None
    conn.send(None)
    try:
        _serve(worker, conn)
    except Exception:
        logger.exception("failed; the tensor-parallel group cannot go on")
        raise SystemExit(1) from None
    finally:
        worker.close()
        group.close()  # before the interpreter's exit: see TPGroup.close


def _serve(worker: Worker, conn: Connection) -> None:
    while True:
        try:
            message = receive(conn)
        except (EOFError, OSError):  # rank 0 closed the connection (stop), or its process or machine is gone
            return
        kind = message[0]
        if kind == STEP:
            step: StepInput = message[1]
            worker.launch(step)
        elif kind == DETERMINE_NUM_KV_BLOCKS:
            worker.determine_num_kv_blocks(*message[1:])
        elif kind == INITIALIZE_CACHE:
            worker.initialize_cache(*message[1:])
        else:
            raise RuntimeError(f"unknown message {kind!r} from rank 0")


if __name__ == "__main__":
    run_rank(rank_connection(sys.argv), node_settings(sys.argv[2:]))
