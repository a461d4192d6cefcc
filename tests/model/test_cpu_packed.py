"""Linears prepacked for oneDNN: same results as the plain method, chosen only where asked and supported."""
from __future__ import annotations

import json

import pytest
import torch

from folovllm.model.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.loader import load_model
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod
from folovllm.model.quantization.packed import PackedLinearMethod, select_linear_methods
from folovllm.platforms import LinearKernels, platform_for
from tests.helpers import switches

CPU = torch.device("cpu")
DTYPES = [d for d in (torch.bfloat16, torch.float32) if platform_for(CPU).linear_kernels(d).dense_fallback == "onednn"]
pytestmark = pytest.mark.skipif(not DTYPES, reason="oneDNN packing is unavailable on this CPU")


def assert_same(packed: torch.Tensor, plain: torch.Tensor) -> None:
    """bf16: bit-identical (both run oneDNN's bf16 GEMM); fp32: oneDNN vs MKL differ in the last bits."""
    if packed.dtype == torch.bfloat16:
        assert torch.equal(packed, plain)
    else:
        torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


def build_pair(make, dtype: torch.dtype) -> tuple[LinearBase, LinearBase]:
    """The same layer with the plain and the packed method, filled with the same random tensors."""
    plain = make(WeightConfig(dtype, CPU, UnquantizedLinearMethod()))
    packed = make(WeightConfig(dtype, CPU, PackedLinearMethod()))
    for name, param in plain.named_parameters():
        shards = getattr(param, "shard_ids", (None,))
        for shard in shards:
            size = (plain.output_sizes[shards.index(shard)] if shard is not None else param.shape[0],
                    *param.shape[1:])
            tensor = torch.randn(size)
            for layer in (plain, packed):
                target = getattr(layer, name)
                if shard is None:
                    target.weight_loader(target, tensor)
                else:
                    target.weight_loader(target, tensor, shard)
    packed.method.process_weights_after_loading(packed)
    return plain, packed


LAYERS = {
    "replicated": lambda w: ReplicatedLinear(48, 40, False, w),
    "row_bias": lambda w: RowParallelLinear(96, 32, True, w),
    "qkv_gqa_bias": lambda w: QKVParallelLinear(64, 16, 4, 2, True, w),
    "gate_up": lambda w: MergedColumnParallelLinear(64, [80, 80], False, w),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
def test_packed_method_equals_plain(layer: str, dtype: torch.dtype, tokens: int) -> None:
    torch.manual_seed(tokens)
    plain, packed = build_pair(LAYERS[layer], dtype)
    assert packed.weight.is_mkldnn and packed.weight.shape == plain.weight.shape
    x = torch.randn(tokens, plain.input_size, dtype=dtype)
    with torch.inference_mode():
        assert_same(packed(x), plain(x))


def test_packed_method_takes_a_strided_input() -> None:
    plain, packed = build_pair(LAYERS["replicated"], DTYPES[0])
    x = torch.randn(5, 96, dtype=DTYPES[0])[:, ::2]
    with torch.inference_mode():
        assert_same(packed(x), plain(x))


def test_selection_packs_only_unquantized_weights_when_asked() -> None:
    onednn, plain = LinearKernels(dense="onednn"), LinearKernels(dense="torch")
    method, head = select_linear_methods("unquantized", None, onednn)
    assert isinstance(method, PackedLinearMethod) and isinstance(head, PackedLinearMethod)
    assert all(type(m) is UnquantizedLinearMethod for m in select_linear_methods("unquantized", None, plain))
    assert platform_for(CPU).linear_kernels(torch.float16).dense == "torch"  # oneDNN takes no fp16 weights here
    with pytest.raises(ValueError, match="quantization 'nope' is not supported"):
        select_linear_methods("nope", None, onednn)


TINY = dict(architectures=["LlamaForCausalLM"], vocab_size=96, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, eos_token_id=2)


@pytest.mark.parametrize("tied", [True, False])
def test_loader_packs_every_linear_and_the_head(tmp_path, tied: bool) -> None:
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, tie_word_embeddings=tied)))
    dtype = DTYPES[0]
    with switches(CPU_LINEAR="onednn"):
        packed = load_model(str(tmp_path), load_format="dummy", dtype=dtype, device="cpu", seed=1,
                            platform=platform_for("cpu"))
    plain = load_model(str(tmp_path), load_format="dummy", dtype=dtype, device="cpu", seed=1)
    linears = [m for m in packed.modules() if isinstance(m, LinearBase)]
    assert linears and all(isinstance(m.method, PackedLinearMethod) and m.weight.is_mkldnn for m in linears)
    assert not any(isinstance(m.method, PackedLinearMethod) for m in plain.modules() if isinstance(m, LinearBase))
    embed = packed.model.embed_tokens
    assert packed.lm_head.weight.is_mkldnn and not embed.weight.is_mkldnn  # the lookup stays plain
    extra = embed.weight.numel() * embed.weight.element_size() if tied else 0
    assert packed.weight_bytes() == plain.weight_bytes() + extra
    hidden = torch.randn(3, TINY["hidden_size"], dtype=dtype)
    with torch.inference_mode():
        assert_same(packed.compute_logits(hidden), plain.compute_logits(hidden))
