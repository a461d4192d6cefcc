"""``folovllm quantize`` on a tiny random Llama folder: the written GPTQ folder, and bad arguments."""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from folovllm.entrypoints.cli import main
from folovllm.model.loader import load_arch_config, load_model
from folovllm.model.loader.tokenizer import load_tokenizer
from folovllm.quantize.checkpoint import dequantize_state_dict

TINY_LLAMA = {
    "vocab_size": 49152,  # the default model's tokenizer, saved next to the weights
    "hidden_size": 64,
    "intermediate_size": 160,  # 160 inputs to down_proj: groups of 32 fit, groups of 48 leave a short one
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "attention_bias": True,
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SHAPES = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (64, 32), "self_attn.v_proj": (64, 32),
          "self_attn.o_proj": (64, 64), "mlp.gate_proj": (64, 160), "mlp.up_proj": (64, 160),
          "mlp.down_proj": (160, 64)}  # (in, out)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, eos_token_id=2, bos_token_id=1))
    model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 40 + "def f(x):\n    return x * 2\n" * 20)
    return path


def quantize(tiny_llama: Path, out: Path, *extra: str) -> int:
    return main(["quantize", "--model", str(tiny_llama), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def gptq_folder(tiny_llama: Path, calib_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gptq") / "out"
    args = ("--group-size", "48", "--num-samples", "4", "--seq-len", "32",  # act-order, asymmetric: the defaults
            "--calib-file", str(calib_file))
    assert quantize(tiny_llama, out, *args) == 0
    return out


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_gptq_folder_tensors(gptq_folder: Path) -> None:
    tensors = read_tensors(gptq_folder)
    for layer in range(2):
        for linear in LINEARS:
            name = f"model.layers.{layer}.{linear}"
            in_features, out_features = SHAPES[linear]
            groups = -(-in_features // 48)
            assert tensors[f"{name}.qweight"].shape == (in_features // 8, out_features)
            assert tensors[f"{name}.qzeros"].shape == (groups, out_features // 8)
            assert tensors[f"{name}.scales"].shape == (groups, out_features)
            assert tensors[f"{name}.scales"].dtype == torch.float16
            assert tensors[f"{name}.g_idx"].shape == (in_features,) and tensors[f"{name}.g_idx"].dtype == torch.int32
            assert int(torch.bincount(tensors[f"{name}.g_idx"].long()).min()) > 0  # every group used
            assert f"{name}.weight" not in tensors
            if linear.startswith("self_attn"):  # attention_bias: q/k/v and o carry biases, the MLP none
                assert tensors[f"{name}.bias"].dtype == torch.float16
            assert not any(key.startswith(f"{name}.") and key.split(".")[-1] not in
                           ("qweight", "qzeros", "scales", "g_idx", "bias") for key in tensors)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            assert tensors[f"model.layers.{layer}.{norm}.weight"].dtype == torch.float16
    for plain in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert tensors[plain].dtype == torch.float16


def test_gptq_folder_config_and_tokenizer(gptq_folder: Path, tiny_llama: Path) -> None:
    config = json.loads((gptq_folder / "config.json").read_text())
    assert config["quantization_config"] | {"meta": None} == {
        "quant_method": "gptq", "bits": 4, "group_size": 48, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
        "lm_head": False, "meta": None,
    }
    assert config["quantization_config"]["meta"]["clip"] == "hmse"  # gptq's default range search
    assert config["torch_dtype"] == "float16"
    arch = load_arch_config(str(gptq_folder))
    source = load_arch_config(str(tiny_llama))
    assert arch.quantization == "gptq"
    assert (arch.hidden_size, arch.num_key_value_heads, arch.tie_word_embeddings) == (64, 2, False)
    assert arch.attention_bias == source.attention_bias
    text = "hello world"
    assert load_tokenizer(str(gptq_folder))(text)["input_ids"] == load_tokenizer(str(tiny_llama))(text)["input_ids"]


def test_dequantized_folder_loads_into_the_unquantized_model(gptq_folder: Path, tiny_llama: Path) -> None:
    model = load_model(str(tiny_llama), dtype=torch.float32, device="cpu")
    original = model.model.layers[1].mlp.down_proj.weight.clone()
    model.load_weights(dequantize_state_dict(read_tensors(gptq_folder), bits=4).items())  # every name, every shape
    restored = model.model.layers[1].mlp.down_proj.weight
    assert not torch.equal(restored, original)
    assert (restored - original).abs().max() < 0.3 * original.abs().max()


def test_rtn_8_bit_asymmetric(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "rtn"
    assert quantize(tiny_llama, out, "--method", "rtn", "--bits", "8", "--group-size", "32") == 0  # asymmetric, no order
    tensors = read_tensors(out)
    assert tensors["model.layers.0.self_attn.q_proj.qweight"].shape == (64 // 4, 64)
    assert tensors["model.layers.0.mlp.down_proj.scales"].shape == (160 // 32, 64)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (config["bits"], config["sym"], config["desc_act"]) == (8, False, False)
    assert config["meta"]["clip"] == "off"  # round-to-nearest's default: plain min/max
    model = load_model(str(tiny_llama), dtype=torch.float32, device="cpu")
    original = model.model.layers[0].self_attn.qkv_proj.weight.clone()
    model.load_weights(dequantize_state_dict(tensors, bits=8).items())
    assert (model.model.layers[0].self_attn.qkv_proj.weight - original).abs().max() < 0.01 * original.abs().max()


def test_symmetric_grid_without_act_order_on_request(tiny_llama: Path, calib_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "sym"
    assert quantize(tiny_llama, out, "--sym", "--no-act-order", "--group-size", "32", "--num-samples", "2",
                    "--seq-len", "16", "--calib-file", str(calib_file)) == 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (config["sym"], config["desc_act"]) == (True, False)
    assert "model.layers.0.mlp.up_proj.g_idx" not in read_tensors(out) or bool(
        (read_tensors(out)["model.layers.0.mlp.up_proj.g_idx"].diff() >= 0).all())  # groups in column order


@pytest.mark.parametrize(("args", "message"), [
    (("--bits", "3"), "bits must be one of"),
    (("--method", "awq"), "unknown quantization method 'awq'"),
    (("--group-size", "0"), "group size must be -1"),
    (("--method", "rtn", "--act-order"), "round-to-nearest has no order"),
    (("--method", "rtn", "--clip", "hmse"), "use --clip mse or off"),
    (("--seq-len", "512"), "exceeds the model's 256 positions"),
    (("--num-samples", "0"), "must be positive"),
    (("--calib-file", "/nonexistent/calib.txt", "--seq-len", "32"), "cannot read calibration file"),
])
def test_bad_arguments_are_clear_errors(
    tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: tuple[str, ...], message: str
) -> None:
    assert quantize(tiny_llama, tmp_path / "out", *args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_non_empty_out_folder_is_refused(tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert quantize(tiny_llama, tmp_path / "out", "--method", "rtn") == 2
    assert "is not empty" in capsys.readouterr().err


def test_a_non_llama_family_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.model.test_gemma3 import tiny_gemma3_config

    config = tiny_gemma3_config()
    config.architectures = ["Gemma3ForCausalLM"]
    config.save_pretrained(tmp_path / "gemma3")  # the config alone: refused before loading
    assert quantize(tmp_path / "gemma3", tmp_path / "out", "--method", "rtn") == 2
    assert "supports Llama-family models" in capsys.readouterr().err


def _gptq_loader_registered() -> bool:
    import folovllm.model.quantization as quant

    from folovllm.model.quantization.linear_method import LINEAR_METHODS

    for module in pkgutil.iter_modules(quant.__path__):
        importlib.import_module(f"{quant.__name__}.{module.name}")
    return "gptq" in LINEAR_METHODS.names()


def test_folovllm_loads_the_written_folder(gptq_folder: Path, tiny_llama: Path) -> None:
    if not _gptq_loader_registered():
        pytest.skip("no 'gptq' linear method registered yet")
    quantized = load_model(str(gptq_folder), dtype=torch.float32, device="cpu")
    reference = load_model(str(tiny_llama), dtype=torch.float32, device="cpu")
    reference.load_weights(dequantize_state_dict(read_tensors(gptq_folder), bits=4).items())
    for ours, ref in zip(quantized.model.layers, reference.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            got, want = ours.get_submodule(name), ref.get_submodule(name)
            inputs = torch.randn(5, got.input_size)
            torch.testing.assert_close(got(inputs), want(inputs), atol=2e-2, rtol=2e-2)
