"""How many KV blocks fit: a memory budget measured at start-up, then divided by a block's size."""
from __future__ import annotations

import logging

import psutil
import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.config import DEFAULT_CPU_KV_CACHE_MEMORY
from folovllm.model.layers import CausalLM
from folovllm.paging import blocks_for_tokens

logger = logging.getLogger(__name__)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size  # K and V


def cpu_kv_budget(kv_cache_memory: int | None) -> int:
    budget = DEFAULT_CPU_KV_CACHE_MEMORY if kv_cache_memory is None else kv_cache_memory
    available = psutil.virtual_memory().available
    if budget > available:
        raise ValueError(f"kv_cache_memory={budget / 2**30:.2f} GiB exceeds the "
                         f"{available / 2**30:.2f} GiB of free RAM; pass a smaller --kv-cache-memory")
    return budget


@torch.inference_mode()
def cuda_kv_budget(model: CausalLM, num_tokens: int, block_size: int,
                   gpu_memory_utilization: float, device: torch.device) -> int:
    """Device memory left for KV after weights and a profiled forward of ``num_tokens`` tokens."""
    arch = model.arch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free_before, total = torch.cuda.mem_get_info(device)
    allocated_before = torch.cuda.memory_allocated(device)
    # A throw-away cache just big enough for one sequence of num_tokens.
    num_blocks = blocks_for_tokens(num_tokens, block_size)
    shape = (num_blocks, block_size, model.num_kv_heads, arch.head_dim)  # this rank's heads
    dtype = model.dtype  # the activation dtype; quantized weights may be held in another
    caches = [(torch.empty(shape, dtype=dtype, device=device),
               torch.empty(shape, dtype=dtype, device=device)) for _ in range(arch.num_hidden_layers)]
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    positions = torch.arange(num_tokens, device=device)
    meta = AttentionMetadata(
        slot_mapping=positions.clone(),
        query_start_loc=torch.tensor([0, num_tokens], device=device),
        seq_lens=torch.tensor([num_tokens], device=device),
        block_tables=torch.arange(num_blocks, device=device).unsqueeze(0),
        query_lens=[num_tokens], seq_lens_list=[num_tokens], block_size=block_size)
    hidden = model(ids, positions, caches, meta)
    model.compute_logits(hidden[-1:])
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


def log_capacity(num_blocks: int, block_size: int, block_bytes: int, max_model_len: int) -> None:
    tokens = num_blocks * block_size
    logger.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB); %.1fx max_model_len=%d",
                num_blocks, block_size, tokens, num_blocks * block_bytes / 2**30,
                tokens / max_model_len, max_model_len)
