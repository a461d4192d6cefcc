"""`folovllm serve` with the multi-node flags: a bad combination is a clear error (exit 2) before
anything starts; `--headless` is only for the nodes that run no engine."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.cli import main


@pytest.mark.parametrize("flags, message", [
    (["-tp", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--master-port", "29500"],
     "node_rank=2 must lie in [0, nnodes=2)"),
    (["-tp", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29500"],
     "tensor_parallel_size=3 does not split evenly over nnodes=2"),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "1", "--master-port", "29500"],
     "nnodes=2 needs --master-addr and --master-port"),
    (["-tp", "2", "--headless"], "--headless runs a node without the engine and server: give it --node-rank"),
])
def test_bad_node_flags_are_a_clear_error(flags: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "some/model", *flags]) == 2
    assert message in capsys.readouterr().err
