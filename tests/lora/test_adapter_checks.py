"""A bad or mismatched adapter is a ValueError naming what does not fit, raised when the request is added:
that request fails alone and the engine keeps serving."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from folovllm import LoRARequest, SamplingParams
from folovllm.lora.adapter import load_adapter, scaling_of
from tests.engine.conftest import make_llm, tiny_llama_dir  # noqa: F401
from tests.lora.adapters import ATTN, module_shapes, write_adapter

GREEDY = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def config(tiny_llama_dir: str):  # noqa: F811
    return AutoConfig.from_pretrained(tiny_llama_dir)


def bad_adapters(root: Path, config) -> dict[str, tuple[Path, str]]:
    """name -> (folder, a piece of the error message)."""
    wrong = {**module_shapes(config), "q_proj": (config.hidden_size * 2, config.hidden_size)}
    missing = root / "missing"
    missing.mkdir(parents=True)
    (missing / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    return {
        "rank": (write_adapter(root / "rank", config, 32, ("q_proj",), 0), "above max_lora_rank=16"),
        "module": (write_adapter(root / "module", config, 4, ("q_proj", "lm_head"), 0,
                                 shapes={**module_shapes(config), "lm_head": (64, 512)}), "lm_head"),
        "shape": (write_adapter(root / "shape", config, 4, ("q_proj",), 0, shapes=wrong), "another base model"),
        "files": (missing, "adapter_model.safetensors"),
        "dora": (write_adapter(root / "dora", config, 4, ("q_proj",), 0, extra_config={"use_dora": True}), "use_dora"),
    }


def test_bad_adapters_fail_their_request_alone(tiny_llama_dir: str, config, tmp_path: Path) -> None:  # noqa: F811
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=16)
    cases = bad_adapters(tmp_path, config)
    for index, (name, (folder, reason)) in enumerate(cases.items(), start=1):
        with pytest.raises(ValueError, match=reason):
            llm.generate([[5, 6, 7]], GREEDY, lora_request=LoRARequest(name, index, str(folder)), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    good = write_adapter(tmp_path / "good", config, 4, ATTN, 1)
    out = llm.generate([[5, 6, 7]], GREEDY, lora_request=LoRARequest("good", 99, str(good)), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="already adapter 'good'"):  # one id, two adapters
        llm.generate([[5]], GREEDY, lora_request=LoRARequest("other", 99, str(tmp_path / "rank")), use_tqdm=False)


def test_lora_off_refuses_an_adapter(tiny_llama_dir: str, config, tmp_path: Path) -> None:  # noqa: F811
    llm = make_llm(tiny_llama_dir)
    folder = write_adapter(tmp_path / "a", config, 4, ("q_proj",), 0)
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate([[5, 6]], GREEDY, lora_request=LoRARequest("a", 1, str(folder)), use_tqdm=False)


def test_request_and_config_checks() -> None:
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
    from folovllm.config import EngineConfig

    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        EngineConfig(enable_lora=True, tensor_parallel_size=2)


def test_scaling_and_packed_pieces(tiny_llama_dir: str, config, tmp_path: Path) -> None:  # noqa: F811
    """rsLoRA's alpha/sqrt(r) against alpha/r; q and v fill their rows of the merged q/k/v output, k stays 0."""
    assert scaling_of({"r": 16, "lora_alpha": 8}) == 0.5
    assert scaling_of({"r": 16, "lora_alpha": 8, "use_rslora": True}) == 2.0
    from folovllm.model.loader import load_model

    arch = load_model(tiny_llama_dir, dtype=torch.float32, device="cpu").arch
    folder = write_adapter(tmp_path / "qv", config, 4, ("q_proj", "v_proj"), 0, alpha=8)
    adapter = load_adapter(LoRARequest("qv", 1, str(folder)), arch, max_rank=8)
    a, (q_piece, v_piece) = adapter.weights[(0, "qkv_proj")]
    q, kv = module_shapes(config)["q_proj"][1], module_shapes(config)["k_proj"][1]
    assert a.shape == (8, config.hidden_size)
    assert (q_piece.row, q_piece.column, q_piece.weight.shape) == (0, 0, (q, 4))
    assert (v_piece.row, v_piece.column, v_piece.weight.shape) == (q + kv, 4, (kv, 4))
    assert adapter.modules == ["qkv_proj"]
