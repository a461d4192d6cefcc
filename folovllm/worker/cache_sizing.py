"""How many KV blocks fit: a memory budget measured at start-up, then divided by a block's size."""
from __future__ import annotations

import logging

import psutil
import torch

from folovllm.attention.kv_quant import KVCacheFormat, cache_element_dtype, cache_row_shape
from folovllm.attention.metadata import AttentionMetadata
from folovllm.config import DEFAULT_CPU_KV_CACHE_MEMORY
from folovllm.model.layers import CausalLM
from folovllm.paging import blocks_for_tokens

logger = logging.getLogger(__name__)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, fmt: KVCacheFormat | None = None) -> int:
    """K and V bytes of one block over every layer: rows in ``dtype``, or a quantized format's codes and scales."""
    element_size = torch.empty((), dtype=cache_element_dtype(dtype, fmt)).element_size()
    return 2 * num_layers * block_size * num_kv_heads * cache_row_shape(head_dim, fmt) * element_size


def cpu_kv_budget(kv_cache_memory: int | None) -> int:
    budget = DEFAULT_CPU_KV_CACHE_MEMORY if kv_cache_memory is None else kv_cache_memory
    available = psutil.virtual_memory().available
    if budget > available:
        raise ValueError(f"kv_cache_memory={budget / 2**30:.2f} GiB exceeds the "
                         f"{available / 2**30:.2f} GiB of free RAM; pass a smaller --kv-cache-memory")
    return budget


def profile_batch(num_tokens: int, max_model_len: int, block_size: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, int]:
    """A step of ``num_tokens`` prefill tokens cut into sequences of at most ``max_model_len`` (positions
    past the model's context would index past its rotary table: a device-side assert on CUDA), each in
    its own blocks. Returns (token ids, positions, attention metadata, blocks used)."""
    query_lens = [max_model_len] * (num_tokens // max_model_len)
    if num_tokens % max_model_len:
        query_lens.append(num_tokens % max_model_len)
    blocks_per_seq = [blocks_for_tokens(n, block_size) for n in query_lens]
    num_blocks = sum(blocks_per_seq)
    block_tables = torch.zeros(len(query_lens), max(blocks_per_seq), dtype=torch.int64)
    positions, slots, first_block = [], [], 0
    for i, (n, seq_blocks) in enumerate(zip(query_lens, blocks_per_seq)):
        block_tables[i, :seq_blocks] = torch.arange(first_block, first_block + seq_blocks)
        pos = torch.arange(n)
        positions.append(pos)
        slots.append(block_tables[i, pos // block_size] * block_size + pos % block_size)
        first_block += seq_blocks
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device), query_start_loc=starts.to(device),
        seq_lens=torch.tensor(query_lens, device=device), block_tables=block_tables.to(device),
        query_lens=query_lens, seq_lens_list=list(query_lens), block_size=block_size)
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    return ids, torch.cat(positions).to(device), meta, num_blocks


@torch.inference_mode()
def cuda_kv_budget(model: CausalLM, num_tokens: int, max_model_len: int, block_size: int,
                   gpu_memory_utilization: float, device: torch.device) -> int:
    """Device memory left for KV after weights and a profiled forward of ``num_tokens`` tokens (the
    largest step: sequences of at most ``max_model_len``)."""
    arch = model.arch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free_before, total = torch.cuda.mem_get_info(device)
    allocated_before = torch.cuda.memory_allocated(device)
    ids, positions, meta, num_blocks = profile_batch(num_tokens, max_model_len, block_size, device)
    # A throw-away cache just big enough for the profiled sequences.
    shape = (num_blocks, block_size, model.num_kv_heads, arch.head_dim)  # this rank's heads
    dtype = model.dtype  # the activation dtype; quantized weights may be held in another
    caches = [(torch.empty(shape, dtype=dtype, device=device),
               torch.empty(shape, dtype=dtype, device=device)) for _ in range(arch.num_hidden_layers)]
    hidden = model(ids, positions, caches, meta)
    model.compute_logits(hidden[meta.query_start_loc[1:] - 1])  # every sequence's last token, as a step samples
    torch.cuda.synchronize(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - allocated_before
    del caches, hidden
    torch.cuda.empty_cache()
    used_outside_profile = total - free_before  # weights, CUDA context, other processes
    budget = int(total * gpu_memory_utilization - used_outside_profile - activation_peak)
    weight_gib = model.weight_bytes() / 2**30
    if budget <= 0:
        raise ValueError(f"no device memory left for the KV cache: weights take {weight_gib:.2f} GiB and a "
                         f"{num_tokens}-token forward {activation_peak / 2**30:.2f} GiB of the "
                         f"{total * gpu_memory_utilization / 2**30:.2f} GiB allowed; raise "
                         "gpu_memory_utilization or lower max_num_batched_tokens")
    logger.info("device memory: %.2f GiB weights, %.2f GiB activation peak, %.2f GiB left for KV",
                weight_gib, activation_peak / 2**30, budget / 2**30)
    return budget


def log_capacity(num_blocks: int, block_size: int, block_bytes: int, max_model_len: int, kv_dtype: str) -> None:
    tokens = num_blocks * block_size
    logger.info("KV cache (%s): %d blocks x %d tokens = %d tokens (%.2f GiB); %.1fx max_model_len=%d",
                kv_dtype, num_blocks, block_size, tokens, num_blocks * block_bytes / 2**30,
                tokens / max_model_len, max_model_len)
