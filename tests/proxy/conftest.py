"""Two fake prefill and two fake decode servers, and proxies in front of them, for the module's tests."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from folovllm.proxy.app import ProxyConfig, build_proxy_app
from tests.proxy.fake_backends import Behaviour, ThreadedServer, fake_server


@dataclass
class Fake:
    name: str
    behaviour: Behaviour
    server: ThreadedServer

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def fakes():
    """{"p0", "p1", "d0", "d1"}: running fakes; their behaviour is reset before each test."""
    made = {}
    for name in ("p0", "p1", "d0", "d1"):
        behaviour = Behaviour()
        made[name] = Fake(name, behaviour, ThreadedServer(fake_server(name, behaviour)).start())
    yield made
    for fake in made.values():
        fake.server.stop()


@pytest.fixture(autouse=True)
def reset_fakes(request):
    if "fakes" in request.fixturenames:
        for fake in request.getfixturevalue("fakes").values():
            fake.behaviour.reset()


@pytest.fixture(scope="module")
def start_proxy():
    """Starts a proxy (uvicorn, in a thread) over the given URLs; all are stopped after the module."""
    started = []

    def start(prefill: list[str], decode: list[str], policy: str = "round_robin", **options) -> ThreadedServer:
        app = build_proxy_app(ProxyConfig(prefill_urls=prefill, decode_urls=decode, policy=policy, **options))
        server = ThreadedServer(app).start()
        server.proxy = app.state.proxy
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def proxy(fakes, start_proxy):
    """A round-robin proxy over one prefill (p0) and one decode (d0) fake."""
    return start_proxy([fakes["p0"].url], [fakes["d0"].url])


@pytest.fixture
def http(proxy):
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        yield client
