"""The roofline's arithmetic: Qwen3-0.6B's size, decode bound by bandwidth, prefill by compute, TP's all-reduce."""
import json

import pytest

from folovllm.simulator.cost_model import StepShape
from folovllm.simulator.roofline import (
    DEVICES,
    QWEN3_0_6B,
    RooflineCostModel,
    load_model_shape,
)


def test_qwen3_0_6b_shape():
    assert QWEN3_0_6B.num_params == pytest.approx(0.596e9, rel=0.01)
    assert QWEN3_0_6B.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2


def test_config_json_gives_the_same_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True}))
    shape = load_model_shape(str(tmp_path))
    assert (shape.num_params, shape.kv_bytes_per_token) == (QWEN3_0_6B.num_params, QWEN3_0_6B.kv_bytes_per_token)
    with pytest.raises(ValueError, match="config.json"):
        load_model_shape(str(tmp_path / "missing"))


def test_decode_is_bandwidth_bound_and_prefill_compute_bound():
    model = RooflineCostModel(QWEN3_0_6B, DEVICES["h100"], overhead_s=0.0)
    decode = StepShape(0, 64, 64 * 1000, 64, attention_pairs=64 * 1000, num_sampled=64)
    assert model.step_time(decode) == pytest.approx(model.bytes(decode) / (3.35e12 * 0.7))
    prefill = StepShape(8192, 0, 8192, 4, attention_pairs=4 * 2048 * 2049 // 2, num_sampled=4)
    assert model.step_time(prefill) == pytest.approx(model.flops(prefill) / (989e12 * 0.5))
    faster = RooflineCostModel(QWEN3_0_6B, DEVICES["h200"], overhead_s=0.0)
    assert faster.step_time(decode) < model.step_time(decode)


def test_tensor_parallel_splits_work_and_adds_all_reduces():
    one = RooflineCostModel(QWEN3_0_6B, DEVICES["h100"], overhead_s=0.0)
    two = RooflineCostModel(QWEN3_0_6B, DEVICES["h100"], tp=2, overhead_s=0.0)
    shape = StepShape(4096, 0, 4096, 2, attention_pairs=2 * 2048 * 2049 // 2, num_sampled=2)
    all_reduce = two.all_reduce_time(4096)
    assert all_reduce == pytest.approx(2 * 28 * (10e-6 + 4096 * 1024 * 2 / 450e9))
    assert two.step_time(shape) == pytest.approx(one.step_time(shape) / 2 + all_reduce)
    assert two.num_kv_blocks(16) > 2 * one.num_kv_blocks(16)
    with pytest.raises(ValueError, match="tensor parallel"):
        RooflineCostModel(QWEN3_0_6B, DEVICES["h100"], tp=0)
