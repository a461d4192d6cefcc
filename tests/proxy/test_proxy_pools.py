"""Backend pools: URL forms, routing policies, in-flight counts."""
import pytest

from folovllm.proxy.pools import ROUTING_POLICIES, BackendPool, normalize_url


def test_urls_are_normalized_to_scheme_host_port():
    assert normalize_url("127.0.0.1:8100") == "http://127.0.0.1:8100"
    assert normalize_url("http://h:1/") == "http://h:1"
    assert normalize_url("https://h:1/v1") == "https://h:1"
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        normalize_url("ftp://h:1")


def test_an_empty_pool_or_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="decode pool needs at least one URL"):
        BackendPool("decode", [], "round_robin")
    with pytest.raises(ValueError, match="least_loaded"):
        BackendPool("decode", ["h:1"], "random")
    assert ROUTING_POLICIES.names() == ["round_robin", "least_loaded"]


def test_round_robin_takes_each_in_turn_whatever_the_load():
    pool = BackendPool("prefill", ["a:1", "b:1", "c:1"], "round_robin")
    pool.backends[1].in_flight = 10
    assert [pool.pick().url[7:] for _ in range(4)] == ["a:1", "b:1", "c:1", "a:1"]


def test_least_loaded_takes_the_fewest_in_flight_and_spreads_ties():
    pool = BackendPool("decode", ["a:1", "b:1", "c:1"], "least_loaded")
    assert len({pool.pick().url for _ in range(3)}) == 3  # idle pool: ties go round
    pool.backends[0].in_flight, pool.backends[1].in_flight, pool.backends[2].in_flight = 2, 0, 1
    assert [pool.pick().url[7:] for _ in range(3)] == ["b:1", "b:1", "b:1"]


def test_a_lease_counts_in_flight_until_it_ends_even_on_error():
    pool = BackendPool("decode", ["a:1"], "least_loaded")
    backend = pool.pick()
    with pytest.raises(RuntimeError):
        with pool.lease(backend):
            assert backend.in_flight == 1
            raise RuntimeError
    assert backend.in_flight == 0
