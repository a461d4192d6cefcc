"""A tensor-parallel rank other than 0: its own process, its slice of the model, no sampling.

It joins the group, loads its weights, says ready, then runs what rank 0 sends, in order: the two
start-up phases, then one step per message. It exits when rank 0's pipe closes (rank 0 stops it or
is gone), or on any error (its peers' collectives then fail at once, and rank 0 reports it).
"""
from __future__ import annotations

import logging
import sys
from multiprocessing.connection import Connection

from folovllm.config import EngineConfig
from folovllm.distributed.channel import receive
from folovllm.distributed.group import backend_for, init_tp_group
from folovllm.distributed.launch import connect_store, rank_connection
from folovllm.worker.step_input import StepInput
from folovllm.worker.worker import Worker

logger = logging.getLogger(__name__)

# Messages from rank 0 (the first item of each tuple).
STEP = "step"
DETERMINE_NUM_KV_BLOCKS = "determine_num_kv_blocks"
INITIALIZE_CACHE = "initialize_cache"


def run_rank(conn: Connection) -> None:
    """The rank's main: its settings from rank 0, start-up (its error, if any, goes back over ``conn``),
    then the message loop."""
    config: EngineConfig
    config, model_path, rank, host, port, log_level = receive(conn)
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s (tp rank {rank}): %(message)s")
    size = config.tensor_parallel_size
    try:
        store = connect_store(host, port, size)
        group = init_tp_group(store, rank, size, backend_for(config.torch_device))
        worker = Worker(config, model_path, group)
    except Exception as err:
        logger.exception("start-up failed")
        conn.send(err)
        return
    conn.send(None)
    try:
        _serve(worker, conn)
    except Exception:
        logger.exception("failed; the tensor-parallel group cannot go on")
        raise SystemExit(1) from None


def _serve(worker: Worker, conn: Connection) -> None:
    while True:
        try:
            message = receive(conn)
        except EOFError:  # rank 0 closed the pipe (stop) or its process is gone
            return
        kind = message[0]
        if kind == STEP:
            step: StepInput = message[1]
            worker.launch(step)
        elif kind == DETERMINE_NUM_KV_BLOCKS:
            worker.determine_num_kv_blocks()
        elif kind == INITIALIZE_CACHE:
            worker.initialize_cache(*message[1:])
        else:
            raise RuntimeError(f"unknown message {kind!r} from rank 0")


if __name__ == "__main__":
    run_rank(rank_connection(sys.argv))
