"""One rank's view of a tensor-parallel group: its rank, the group size, and the collectives layers call.

The group is a bare ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` built from a store, not torch's global
default group, so two engines (or a test and an engine) can each own one in the same process.
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

# Collectives only run inside a step, so a peer that takes this long is stuck or gone.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
BACKENDS = ("gloo", "nccl")


class TPGroup:
    """rank / size and the collectives of tensor parallelism over one process group.

    ``collective_s`` and ``num_collectives`` add up the host time spent in collectives (on CUDA only
    the launch, NCCL runs asynchronously): the step-time breakdown reads them.
    """

    def __init__(self, process_group: dist.ProcessGroup, rank: int, size: int, backend: str) -> None:
        self.process_group, self.rank, self.size, self.backend = process_group, rank, size, backend
        self.collective_s = 0.0
        self.num_collectives = 0

    @property
    def is_first(self) -> bool:
        """Rank 0: the rank that samples and talks to the engine."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums ``x`` over the ranks, in place; returns it."""
        start = time.perf_counter()
        self.process_group.allreduce([x]).wait()
        self._count(start)
        return x

    def gather_to_first(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
        """Rank 0 gets every rank's ``x`` concatenated along ``dim`` (rank order); the others get None."""
        start = time.perf_counter()
        x = x.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.is_first:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            self.process_group.gather([parts], [x], opts).wait()
            self._count(start)
            return torch.cat(parts, dim=dim)
        self.process_group.gather([], [x], opts).wait()
        self._count(start)
        return None

    def all_reduce_min(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's ``value`` (e.g. the KV block count all ranks can hold)."""
        t = torch.tensor([value], dtype=torch.int64, device=device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.process_group.allreduce([t], opts).wait()
        return int(t.item())

    def close(self) -> None:
        """Destroys the process group now, joining its threads. Each collective's tensors are released on
        those threads, which need the interpreter for it: left to the interpreter's exit, that release
        aborts the process (a thread that asks for the GIL while Python finalizes is ended mid-C++)."""
        self.process_group = None

    def _count(self, start: float) -> None:
        self.collective_s += time.perf_counter() - start
        self.num_collectives += 1


def init_tp_group(store: dist.Store, rank: int, size: int, backend: str,
                  gloo_address: str | None = None) -> TPGroup:
    """Joins the group (blocks until all ``size`` ranks have joined through ``store``).

    ``gloo_address``: the local address gloo listens on and tells its peers (across machines, one they
    can reach); None: gloo's own choice (this machine's hostname, or ``GLOO_SOCKET_IFNAME``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if not 0 <= rank < size:
        raise ValueError(f"rank={rank} must lie in [0, {size})")
    if backend == "gloo" and gloo_address is not None:
        gloo_options = dist.ProcessGroupGloo._Options()
        gloo_options._devices = [dist.ProcessGroupGloo.create_device(hostname=gloo_address)]
        gloo_options._timeout = COLLECTIVE_TIMEOUT
        pg = dist.ProcessGroupGloo(store, rank, size, gloo_options)
    elif backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT)
    else:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = COLLECTIVE_TIMEOUT
        pg = dist.ProcessGroupNCCL(store, rank, size, options)
    return TPGroup(pg, rank, size, backend)
