"""``folovllm proxy``'s flags."""
import pytest

from folovllm.entrypoints.cli import build_parser
from folovllm.proxy.server import run_proxy


def test_the_cli_takes_pools_policy_and_address():
    args = build_parser().parse_args(["proxy", "--prefill", "127.0.0.1:8100", "http://h:8101",
                                      "--decode", "http://h:8200", "--policy", "least_loaded", "--port", "9000"])
    assert args.func is run_proxy
    assert (args.prefill, args.decode, args.policy, args.port) == (
        ["127.0.0.1:8100", "http://h:8101"], ["http://h:8200"], "least_loaded", 9000)


def test_both_pools_are_required():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "--prefill", "h:1"])


def test_a_timeout_must_be_positive():
    args = build_parser().parse_args(["proxy", "--prefill", "h:1", "--decode", "h:2", "--read-timeout", "0"])
    with pytest.raises(ValueError, match="--read-timeout must be positive"):
        run_proxy(args)
