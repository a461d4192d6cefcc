"""How rank 0 and the ranks of other nodes find each other: the step listener accepts exactly the ranks
it expects (a stranger is turned away), names the missing ones past its timeout, and a remote rank's
closed connection reads as its end. The rendezvous store listens only on the address it is given."""
from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection

import pytest

from folovllm.distributed.channel import receive, send_to_ranks
from folovllm.distributed.launch import RankFailedError, connect_store, rendezvous_store
from folovllm.distributed.nodes import StepListener, connect_to_first, gloo_address


def _connect_later(store, ranks: list[int], out: list[socket.socket]) -> threading.Thread:
    def run() -> None:
        out.extend(connect_to_first(store, rank) for rank in ranks)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_listener_accepts_the_expected_ranks_and_turns_strangers_away() -> None:
    store = rendezvous_store(4)
    listener = StepListener("127.0.0.1")
    listener.publish(store)
    client = connect_store("127.0.0.1", store.port, 4)
    stranger = socket.create_connection(listener.address.rsplit(":", 1))  # not a rank: says nothing useful
    stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")
    theirs: list[socket.socket] = []
    thread = _connect_later(client, [3, 2], theirs)
    remotes = listener.accept_ranks([2, 3], timeout_s=30)
    thread.join()
    assert [r.rank for r in remotes] == [2, 3]
    assert all(r.is_alive() for r in remotes)
    send_to_ranks([r.conn for r in remotes], ("step", 7))  # the channel works over TCP as over socket pairs
    conns = {rank: Connection(sock.detach()) for rank, sock in zip([3, 2], theirs)}
    assert receive(conns[2]) == receive(conns[3]) == ("step", 7)
    conns[3].close()  # rank 3's process is gone: its end closes
    assert remotes[1].describe().startswith("rank 3 (127.0.0.1:")
    assert remotes[1].describe().endswith("connection lost")
    assert remotes[1].conn.poll(30)  # waits for the close to arrive
    assert not remotes[1].is_alive() and remotes[0].is_alive()
    remotes[0].stop(1.0)
    with pytest.raises(EOFError):  # rank 0 stopped: rank 2 reads EOF
        receive(conns[2])
    stranger.close()


def test_ranks_that_never_connect_are_named_past_the_timeout() -> None:
    store = rendezvous_store(3)
    listener = StepListener("127.0.0.1")
    listener.publish(store)
    theirs: list[socket.socket] = []
    thread = _connect_later(connect_store("127.0.0.1", store.port, 3), [1], theirs)
    with pytest.raises(RankFailedError, match=r"rank\(s\) 2 did not connect to 127\.0\.0\.1:\d+ within 1 s: start it"):
        listener.accept_ranks([1, 2], timeout_s=1.0, hint=": start it")
    thread.join()
    with pytest.raises(EOFError):  # the rank that did connect is let go
        receive(Connection(theirs[0].detach()))


def test_the_store_listens_only_on_its_address() -> None:
    store = rendezvous_store(2, "127.0.0.1", 0)
    with socket.socket() as probe:  # the port is taken on 127.0.0.1 ...
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", store.port))
    with socket.socket() as probe:  # ... but not on another local address (all of 127/8 is this machine's)
        probe.bind(("127.0.0.2", store.port))


def test_gloo_listens_where_node_zero_can_reach_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert gloo_address("127.0.0.1", 1) is None  # one machine: gloo's own choice, as before
    assert gloo_address("127.0.0.1", 2) == "127.0.0.1"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert gloo_address("127.0.0.1", 2) is None  # the user named the interface
