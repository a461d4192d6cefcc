"""Rank 0 hands each message (a step's plain ``StepInput``, or a start-up command) to the other ranks.

A message is pickled once and written to one pipe per rank: no collective is involved, so a rank may
wait between steps for as long as the server idles (a collective would time out), and reads EOF at
once when rank 0's process is gone.
"""
from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any


def send_to_ranks(conns: list[Connection], message: Any) -> None:
    """Pickles ``message`` once and writes it to every rank's pipe."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    for conn in conns:
        conn.send_bytes(data)


def receive(conn: Connection) -> Any:
    """The next message from rank 0 (EOFError once rank 0 is gone)."""
    return pickle.loads(conn.recv_bytes())
