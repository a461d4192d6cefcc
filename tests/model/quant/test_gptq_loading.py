"""GPTQ checkpoints through the real loader: logits match the dequantized model; errors say what is wrong."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm.bench.gpu_runs import save_tokenizer
from folovllm.model.loader import load_model
from folovllm.model.quantization.cpu_int4 import CpuInt4Kernel
from folovllm.model.quantization.kernels import Int4Kernel, ReferenceGPTQKernel
from folovllm.platforms import platform_for
from tests.model.quant.gptq_checkpoint import gptq_state_dict, write_folder
from tests.model.test_loader import prefill_logits
from tests.tiers import kernel_missing

PROMPT = [5, 17, 3, 99, 42, 7, 250, 11, 64, 1, 300, 2, 18]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """A random HF Llama (hidden 64, GQA 4/2 heads, untied head): config, state dict, tokenizer folder."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=2, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tiny_llama_tokenizer")
    save_tokenizer(folder)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {**config.to_dict(), "architectures": ["LlamaForCausalLM"]}, state, folder


def make_gptq_model(tiny_llama, root: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True,
                    desc_act: bool = False, checkpoint_format: str | None = None,
                    **config_extra) -> tuple[str, str]:
    """(GPTQ folder, float folder holding the same dequantized weights)."""
    config, state, tokenizer_folder = tiny_llama
    zero_offset = 0 if checkpoint_format == "gptq_v2" else 1
    gptq, dense = gptq_state_dict(state, bits, group_size, sym, desc_act, zero_offset)
    quant_config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym,
                    "desc_act": desc_act, **config_extra}
    if checkpoint_format:
        quant_config["checkpoint_format"] = checkpoint_format
    tokenizer = {p.name: p.read_text() for p in tokenizer_folder.iterdir() if p.is_file()}
    base = {k: v for k, v in config.items() if k != "quantization_config"}
    gptq_dir = write_folder(root / "gptq", {**base, "quantization_config": quant_config}, gptq, tokenizer)
    dense_dir = write_folder(root / "dense", base, dense, tokenizer)
    return gptq_dir, dense_dir


@pytest.mark.parametrize("bits, group_size, sym, desc_act, checkpoint_format", [
    (4, 32, True, False, None),
    (4, 128, False, True, "gptq"),  # group larger than the 64-wide input: one partial group
    (4, 64, False, True, "gptq_v2"),
    (8, -1, True, False, None),
    (8, 32, False, True, None),
])
def test_gptq_logits_match_dequantized_model(tiny_llama, tmp_path: Path, bits: int, group_size: int, sym: bool,
                                             desc_act: bool, checkpoint_format: str | None) -> None:
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=bits, group_size=group_size, sym=sym,
                                          desc_act=desc_act, checkpoint_format=checkpoint_format)
    quantized = load_model(gptq_dir, dtype=torch.float32, device="cpu", platform=platform_for("cpu"))
    reference = load_model(dense_dir, dtype=torch.float32, device="cpu")
    qkv = quantized.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant_kernel, torch.nn.Module) and not isinstance(qkv.quant_kernel, ReferenceGPTQKernel)
    expected = prefill_logits(reference, PROMPT)
    torch.testing.assert_close(prefill_logits(quantized, PROMPT), expected, rtol=1e-4, atol=1e-4)


def test_gptq_bf16_and_reference_switch(tiny_llama, tmp_path: Path, monkeypatch) -> None:
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32, desc_act=True)
    expected = prefill_logits(load_model(dense_dir, dtype=torch.float32, device="cpu"), PROMPT)
    bf16 = load_model(gptq_dir, dtype=torch.bfloat16, device="cpu", platform=platform_for("cpu"))
    int4_class = Int4Kernel if kernel_missing("int4") else CpuInt4Kernel  # auto: ours where it runs
    assert isinstance(bf16.model.layers[0].mlp.gate_up_proj.quant_kernel, int4_class)
    got = prefill_logits(bf16, PROMPT, dtype=torch.bfloat16)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", "reference")
    forced = load_model(gptq_dir, dtype=torch.float32, device="cpu", platform=platform_for("cpu"))
    assert isinstance(forced.model.layers[0].mlp.down_proj.quant_kernel, ReferenceGPTQKernel)
    torch.testing.assert_close(prefill_logits(forced, PROMPT), expected, rtol=1e-4, atol=1e-4)


def test_gptq_weight_bytes_count_packed_tensors(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32)
    quantized = load_model(gptq_dir, dtype=torch.bfloat16, device="cpu", platform=platform_for("cpu"))
    dense = load_model(dense_dir, dtype=torch.bfloat16, device="cpu")
    layer = quantized.model.layers[0].mlp.gate_up_proj
    assert not hasattr(layer, "qweight")  # repacked: the checkpoint tensors are gone
    linear_bytes = sum(t.numel() * t.element_size() for t in layer.buffers())
    # 4 bits per weight plus a bf16 scale and offset per 32 inputs
    assert linear_bytes == 256 * 64 // 2 + (64 // 32) * 256 * 2 * 2
    assert quantized.weight_bytes() < dense.weight_bytes()


def test_autogptq_quantize_config_json_and_zero_biases(tiny_llama, tmp_path: Path) -> None:
    """AutoGPTQ's quantize_config.json beside config.json; zero biases stored for bias-free layers."""
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32)
    config_path = Path(gptq_dir) / "config.json"
    config = json.loads(config_path.read_text())
    (Path(gptq_dir) / "quantize_config.json").write_text(json.dumps(
        {k: v for k, v in config.pop("quantization_config").items() if k != "quant_method"}))
    config_path.write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(Path(gptq_dir) / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.float16)
    save_file(tensors, str(Path(gptq_dir) / "model.safetensors"))
    quantized = load_model(gptq_dir, dtype=torch.float32, device="cpu")
    assert quantized.arch.quantization == "gptq"
    expected = prefill_logits(load_model(dense_dir, dtype=torch.float32, device="cpu"), PROMPT)
    torch.testing.assert_close(prefill_logits(quantized, PROMPT), expected, rtol=1e-4, atol=1e-4)


def _edit_config(folder: str, **quant_config) -> None:
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(quant_config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("edit, message", [
    ({"bits": 3}, r"GPTQ bits=3 is not supported; supported: \[4, 8\]"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin' is not supported"),
    ({"lm_head": True}, "quantized lm_head"),
    ({"quant_method": "awq"}, r"quantization 'awq' is not supported; supported: \[.*'gptq'.*'int8'"),
])
def test_bad_quantization_config_is_a_clear_error(tiny_llama, tmp_path: Path, edit: dict, message: str) -> None:
    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path)
    _edit_config(gptq_dir, **edit)
    with pytest.raises(ValueError, match=message):
        load_model(gptq_dir, dtype=torch.float32, device="cpu")


def test_missing_g_idx_with_desc_act_is_named(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path, desc_act=True)
    from safetensors.torch import load_file, save_file

    path = str(Path(gptq_dir) / "model.safetensors")
    save_file({k: v for k, v in load_file(path).items() if not k.endswith("g_idx")}, path)
    with pytest.raises(ValueError, match="missing .*g_idx"):
        load_model(gptq_dir, dtype=torch.float32, device="cpu")


def test_g_idx_is_optional_without_desc_act(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, group_size=32)
    from safetensors.torch import load_file, save_file

    path = str(Path(gptq_dir) / "model.safetensors")
    save_file({k: v for k, v in load_file(path).items() if not k.endswith("g_idx")}, path)
    expected = prefill_logits(load_model(dense_dir, dtype=torch.float32, device="cpu"), PROMPT)
    torch.testing.assert_close(prefill_logits(load_model(gptq_dir, dtype=torch.float32, device="cpu"), PROMPT),
                               expected, rtol=1e-4, atol=1e-4)


def test_mismatched_shapes_and_wrong_bits_are_named(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path, bits=8, group_size=32)
    _edit_config(gptq_dir, bits=4)  # 8-bit tensors read as 4-bit: every packed shape is off
    with pytest.raises(ValueError, match=r"checkpoint tensor 'model\.layers\.0\..*\.qweight' has shape"):
        load_model(gptq_dir, dtype=torch.float32, device="cpu")


def test_merged_pieces_must_share_g_idx(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path, desc_act=True)
    from safetensors.torch import load_file, save_file

    path = str(Path(gptq_dir) / "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.0.self_attn.k_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"self_attn\.[qk]_proj\.g_idx.*differs from the other pieces"):
        load_model(gptq_dir, dtype=torch.float32, device="cpu")


def test_quantization_knob_conflicts(tiny_llama, tmp_path: Path) -> None:
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path)
    assert load_model(gptq_dir, quantization="gptq", dtype=torch.float32, device="cpu").arch.quantization == "gptq"
    with pytest.raises(ValueError, match="already quantized \\('gptq'\\)"):
        load_model(gptq_dir, quantization="int8", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="needs a gptq checkpoint, but 'dense' is 'unquantized'"):
        load_model(dense_dir, quantization="gptq", dtype=torch.float32, device="cpu")


def test_our_gptq_checkpoint_matches_transformers(tiny_llama, tmp_path: Path) -> None:
    """transformers reads GPTQ checkpoints through optimum + gptqmodel; neither is installed here (CPU-only
    wheels need a compiler), so this runs only where they are."""
    pytest.importorskip("optimum", reason="transformers needs optimum to load GPTQ checkpoints")
    pytest.importorskip("gptqmodel", reason="transformers needs gptqmodel to load GPTQ checkpoints")
    from transformers import AutoModelForCausalLM

    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32, sym=True)
    hf = AutoModelForCausalLM.from_pretrained(gptq_dir, torch_dtype=torch.float32, device_map="cpu").eval()
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].float()
    ours = prefill_logits(load_model(gptq_dir, dtype=torch.float32, device="cpu"), PROMPT)
    torch.testing.assert_close(ours, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_gptqmodel_checkpoint_loads_in_ours(tiny_llama, tmp_path: Path) -> None:
    """A checkpoint that GPTQModel quantizes and writes (asymmetric, act-order, groups of 32) loads here and
    gives the logits GPTQModel's own model gives. GPTQModel needs a newer torch than the CPU torch this
    project pins, so this runs only where it is installed."""
    gptqmodel = pytest.importorskip(
        "gptqmodel", reason="GPTQModel is not installed: it needs torch >= 2.14.1 and this project pins torch 2.13.0")
    config, state, tokenizer_folder = tiny_llama
    tokenizer = {p.name: p.read_text() for p in tokenizer_folder.iterdir() if p.is_file()}
    dense_dir = write_folder(tmp_path / "dense", config, state, tokenizer)
    quantized = gptqmodel.GPTQModel.load(dense_dir, gptqmodel.QuantizeConfig(bits=4, group_size=32, sym=False,
                                                                             desc_act=True), device="cpu")
    gen = torch.Generator().manual_seed(0)
    calibration = [{"input_ids": ids, "attention_mask": [1] * len(ids)}
                   for ids in torch.randint(3, 512, (16, 48), generator=gen).tolist()]
    quantized.quantize(calibration, batch_size=1)
    out = tmp_path / "gptqmodel"
    quantized.save(str(out))
    reloaded = gptqmodel.GPTQModel.load(str(out), device="cpu")
    with torch.no_grad():
        expected = reloaded.model(torch.tensor([PROMPT])).logits[0].float()
    ours = prefill_logits(load_model(str(out), dtype=torch.float32, device="cpu"), PROMPT)
    torch.testing.assert_close(ours, expected, rtol=2e-2, atol=2e-2)
