"""The collectives tensor parallelism uses, between two spawned gloo ranks on loopback."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folovllm.distributed.group import TPGroup, init_tp_group
from folovllm.distributed.launch import describe_exit, rendezvous_store
from tests.helpers import run_ranks


def _check_collectives(rank: int, group: TPGroup) -> None:
    assert (group.rank, group.size, group.is_first) == (rank, 2, rank == 0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.full((3, 4), float(rank + 1), dtype=dtype)
        assert group.all_reduce(x) is x and torch.equal(x, torch.full((3, 4), 3.0, dtype=dtype))
    part = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank
    gathered = group.gather_to_first(part)
    if rank == 0:
        assert torch.equal(gathered, torch.cat([part, part + 10], dim=-1))
    else:
        assert gathered is None
    assert group.all_reduce_min(100 - rank, torch.device("cpu")) == 99
    assert group.num_collectives == 3 and group.collective_s > 0


def test_collectives_between_two_ranks() -> None:
    run_ranks(_check_collectives, 2)


def _gloo_threads() -> int:
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().startswith("pt_gloo") for task in tasks.iterdir())


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_close_joins_the_groups_threads() -> None:
    """A rank's threads end before it returns to the interpreter's exit, where releasing a collective's
    tensors on one of them would abort the process."""
    before = _gloo_threads()
    group = init_tp_group(rendezvous_store(1), 0, 1, "gloo")
    x = torch.ones(4)
    assert torch.equal(group.all_reduce(x), torch.ones(4))
    assert _gloo_threads() > before
    group.close()
    assert _gloo_threads() == before


def test_each_rendezvous_gets_its_own_free_port() -> None:
    first, second = rendezvous_store(2), rendezvous_store(2)
    assert first.port != second.port and first.port > 0


def test_exit_codes_in_words() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(None) == "exit status unknown"
