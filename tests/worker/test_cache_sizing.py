"""KV budget on CUDA: the profile's arithmetic, and a clear error naming the weight bytes (CUDA faked)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from folovllm.model.loader import load_model
from folovllm.worker import cache_sizing
from tests.model.test_loader import QWEN3_SMALL

GIB = 2**30


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """torch.cuda's memory queries answered from a dict, so the profile runs on the CPU."""
    memory = {"free": 10 * GIB, "total": 16 * GIB, "peak": GIB}
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (memory["free"], memory["total"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: memory["peak"])
    return memory


def test_cuda_budget_subtracts_what_is_used_and_names_weights_when_nothing_is_left(
    tmp_path: Path, fake_cuda: dict[str, int]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    model = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu")
    budget = cache_sizing.cuda_kv_budget(model, 16, 16, 4, 0.5, torch.device("cpu"))
    assert budget == 8 * GIB - 6 * GIB - GIB
    fake_cuda["free"] = 8 * GIB
    weight_mib = model.weight_bytes() / 2**20
    assert 1 < weight_mib < 2  # bf16: half of the fp32 size, plus the fp32 rope table
    with pytest.raises(ValueError, match=r"weights take 0.00 GiB .* raise gpu_memory_utilization"):
        cache_sizing.cuda_kv_budget(model, 16, 16, 4, 0.5, torch.device("cpu"))


def test_profile_batch_cuts_the_step_into_sequences_no_longer_than_max_model_len() -> None:
    ids, positions, meta, num_blocks = cache_sizing.profile_batch(50, 16, 4, torch.device("cpu"))
    assert meta.query_lens == [16, 16, 16, 2] and meta.seq_lens.tolist() == [16, 16, 16, 2]
    assert len(ids) == len(positions) == 50 and int(positions.max()) == 15
    assert meta.query_start_loc.tolist() == [0, 16, 32, 48, 50]
    assert num_blocks == 4 + 4 + 4 + 1
    slots = meta.slot_mapping.tolist()
    assert sorted(slots) == slots and len(set(slots)) == 50  # every token its own slot, no block shared
    assert max(slots) < num_blocks * 4
    for i, n in enumerate(meta.query_lens):  # each sequence's slots are its block table's
        start = int(meta.query_start_loc[i])
        table = meta.block_tables[i].tolist()
        assert [table[p // 4] * 4 + p % 4 for p in range(n)] == slots[start:start + n]


def test_cuda_budget_profiles_a_step_longer_than_the_model_context(
    tmp_path: Path, fake_cuda: dict[str, int]
) -> None:
    """max_num_batched_tokens may exceed max_position_embeddings: the profile must still run (one long
    sequence would index past the rotary table; on CUDA a device-side assert)."""
    config = {**QWEN3_SMALL, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path), load_format="dummy", dtype=torch.float32, device="cpu")
    budget = cache_sizing.cuda_kv_budget(model, 200, 64, 16, 0.5, torch.device("cpu"))
    assert budget == 8 * GIB - 6 * GIB - GIB
