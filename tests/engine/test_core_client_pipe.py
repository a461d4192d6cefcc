"""ProcessCore's message pipe under uvloop: a message the child is still writing when the event loop
starts reading it (a slow writer on a loaded machine, or one longer than the pipe's buffer) arrives whole
instead of reading as the engine's death."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import struct
import threading
import time
from types import SimpleNamespace

import pytest

from folovllm.engine.core_client import ProcessCore

uvloop = pytest.importorskip("uvloop")


def write_slowly(fd: int, message: object) -> None:
    """``message`` as ``Connection.send`` frames it (a 4-byte length, then the pickle), in two parts a pause apart."""
    body = pickle.dumps(message)
    framed = struct.pack("!i", len(body)) + body
    os.write(fd, framed[:1000])
    time.sleep(0.3)
    view = memoryview(framed)[1000:]
    while view:
        view = view[os.write(fd, view):]


def test_a_message_written_in_parts_arrives_whole():
    reader, writer = multiprocessing.Pipe(duplex=False)
    core = object.__new__(ProcessCore)  # the pipe's reading side only: no child process
    core._conn, core._proc = reader, SimpleNamespace(join=lambda timeout: None, exitcode=None)
    payload = {"tokens": list(range(20_000))}
    seen = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_message(message) -> None:
            seen.append(message)
            if not done.done():
                done.set_result(None)

        core.attach(loop, on_message)
        sender = threading.Thread(target=write_slowly, args=(writer.fileno(), payload))
        sender.start()
        await asyncio.wait_for(done, 30)
        loop.remove_reader(reader.fileno())
        sender.join()

    uvloop.run(main())
    assert seen == [payload]
