"""Small shared test utilities."""
from __future__ import annotations

import contextlib
import os

import torch

from folovllm import envs
from folovllm.attention.metadata import AttentionMetadata
from folovllm.request import RequestStatus


def make_attn_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for a ragged batch: sequence i adds query_lens[i] tokens ending at seq_lens[i]."""
    slots = []
    for q_len, s_len, table in zip(query_lens, seq_lens, block_tables):
        for pos in range(s_len - q_len, s_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int64, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int64, device=device),
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
        block_size=block_size,
    )


class BlockPool:
    """Hands out shuffled block ids so block tables are non-contiguous, like a real cache after churn."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()

    def grow(self, table: list[int], num_tokens: int, block_size: int) -> list[int]:
        """Append blocks to ``table`` until it holds ``num_tokens`` tokens."""
        while len(table) * block_size < num_tokens:
            table.append(self.free.pop())
        return table


def use_triton_interpreter_without_cuda() -> None:
    """Without CUDA, make sure Triton kernels run on CPU tensors through Triton's interpreter.

    TRITON_INTERPRET=1 must be set before triton is first imported, since ``@triton.jit`` reads it
    as it decorates (tests/conftest.py sets it). Also works around triton-lang/triton#9171 (Triton
    3.6's interpreter cannot use a loaded scalar as a ``range`` bound under numpy >= 2.4).
    """
    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    from triton.runtime import interpreter

    if not isinstance(tl.zeros, interpreter.InterpretedFunction):
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set, so its own "
                           "kernels (tl.zeros, ...) will not run in the interpreter")
    original = interpreter._patch_lang_tensor
    if getattr(original, "folovllm_patched", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.folovllm_patched = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _rank_entry(rank: int, fn, port: int, size: int, args: tuple) -> None:
    from folovllm.distributed.group import init_tp_group
    from folovllm.distributed.launch import LOOPBACK, connect_store

    torch.set_num_threads(1)
    group = init_tp_group(connect_store(LOOPBACK, port, size), rank, size, "gloo")
    fn(rank, group, *args)
    group.all_reduce(torch.zeros(1))  # every rank is done with the group before any leaves
    group.close()  # as a rank does: a clean exit after it (spawn fails the test on any other)


def run_ranks(fn, size: int, *args) -> None:
    """Runs ``fn(rank, group, *args)`` in ``size`` spawned processes joined in one gloo ``TPGroup``
    (loopback, a free port); an assertion failing in any rank fails the caller with its traceback.
    ``fn`` must be importable by name (a module-level function)."""
    import torch.multiprocessing as mp

    from folovllm.distributed.launch import rendezvous_store

    store = rendezvous_store(size)  # kept alive while the ranks run: they rendezvous through it
    mp.spawn(_rank_entry, args=(fn, store.port, size, args), nprocs=size, join=True)


def switches(**values: str) -> contextlib.AbstractContextManager[None]:
    """FOLOVLLM_* variables (``CPU_FUSED_OPS="off"`` sets FOLOVLLM_CPU_FUSED_OPS) for the block: the engines
    and platforms built inside read them."""
    return envs.overridden({f"FOLOVLLM_{key}": value for key, value in values.items()})


def cpu_model(path: str, dtype: torch.dtype, switch_values: dict[str, str] | None = None, **load_kwargs):
    """A model as the engine's worker builds it on the CPU platform: loaded with the platform's kernels, its
    weights placed, then compiled into its forms; ``switch_values`` (as ``switches`` takes them) hold while the
    platform decides."""
    from folovllm.compilation import compile_model
    from folovllm.model.loader import load_model
    from folovllm.platforms import platform_for

    with switches(**(switch_values or {})):
        platform = platform_for("cpu")
        model = load_model(path, dtype=dtype, device="cpu", platform=platform, **load_kwargs)
        platform.place_weights(model)
        compile_model(model, platform)
    return model


def fake_model_step(scheduler, out, token: int) -> list:
    """A model step on the scheduler alone: each scheduled request computes its new tokens, one caught up emits
    ``token``, one at its max_tokens finishes by length. Returns those that finished, in batch order."""
    finished = []
    for request, num_new in zip(out.requests, out.num_new_tokens):
        request.num_computed_tokens += num_new
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token(token)
            if request.num_output_tokens >= request.max_tokens:
                scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
                finished.append(request)
    return finished
