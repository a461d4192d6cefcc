"""The feature matrix, weights and architectures: GPTQ 4-bit and int8 weights give the greedy tokens of
transformers on the dequantized weights (top-2 rule), and Gemma 3 (sliding-window layers, chunked prefill,
prefix hits) gives transformers' own, each on the same device. CPU twins here; CUDA cases in the GPU check."""
from __future__ import annotations

from pathlib import Path

import pytest

from folovllm.bench.gpu_runs import save_tokenizer
from folovllm.model.quantization.int8 import quantize_int8_per_channel
from tests.matrix.engines import DEVICES, engine, greedy, hf_model, token_prompts
from tests.model.quant.gptq_checkpoint import LINEAR_NAMES, write_folder
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401
from tests.model.test_gemma3 import random_hf_model, tiny_gemma3_config
from tests.tolerance import assert_greedy_match, hf_greedy

PROMPTS = token_prompts(3, seed=6, low=4, high=40, vocab=512)
MAX_TOKENS = 12


def assert_greedy_like_transformers(ours_dir: str, reference_dir: str, device: str, **settings) -> None:
    outs = engine(ours_dir, device, **settings).generate([{"prompt_token_ids": p} for p in PROMPTS],
                                                          greedy(MAX_TOKENS, detokenize=False), use_tqdm=False)
    model = hf_model(reference_dir, device)
    for prompt, out in zip(PROMPTS, outs):
        assert_greedy_match(out.outputs[0].token_ids, *hf_greedy(model, prompt, MAX_TOKENS))


def int8_reference(tiny_llama, root: Path) -> tuple[str, str]:  # noqa: F811
    """(the float checkpoint, the same with each linear's weight int8-quantized and dequantized per channel)."""
    config, state, tokenizer_folder = tiny_llama
    tokenizer = {p.name: p.read_text() for p in tokenizer_folder.iterdir() if p.is_file()}
    dequantized = {}
    for name, tensor in state.items():
        if name.rpartition(".")[0].rpartition(".")[2] in LINEAR_NAMES:
            codes, scales = quantize_int8_per_channel(tensor)
            tensor = codes.float() * scales[:, None]
        dequantized[name] = tensor.contiguous()
    return (write_folder(root / "float", config, {k: v.contiguous() for k, v in state.items()}, tokenizer),
            write_folder(root / "int8_dequantized", config, dequantized, tokenizer))


@pytest.mark.parametrize("device", DEVICES)
def test_gptq_4bit_greedy_equals_the_dequantized_reference(tiny_llama, tmp_path: Path, device: str) -> None:  # noqa: F811
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32, sym=False, desc_act=True)
    assert_greedy_like_transformers(gptq_dir, dense_dir, device, quantization="gptq", quantize_lm_head="off")


@pytest.mark.parametrize("device", DEVICES)
def test_int8_weights_greedy_equals_the_dequantized_reference(tiny_llama, tmp_path: Path, device: str) -> None:  # noqa: F811
    float_dir, dequantized_dir = int8_reference(tiny_llama, tmp_path)
    assert_greedy_like_transformers(float_dir, dequantized_dir, device, quantization="int8", quantize_lm_head="off")


@pytest.mark.parametrize("device", DEVICES)
def test_gemma3_greedy_equals_transformers(tmp_path: Path, device: str) -> None:
    """A 4-token sliding window on some layers, 8-token prefill chunks, and a prompt served from the cache past
    the window."""
    path = tmp_path / "gemma3"
    random_hf_model(tiny_gemma3_config()).save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)  # prompts are token ids; any tokenizer will do
    model = hf_model(str(path), device)
    llm = engine(str(path), device, max_num_batched_tokens=8)
    shared = list(range(40, 40 + 16))  # one full block
    prompts = token_prompts(2, seed=7, low=3, high=21, vocab=256) + [shared + [7, 8]]
    params = greedy(MAX_TOKENS, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    outs += llm.generate([{"prompt_token_ids": shared + [9, 10, 11]}], params, use_tqdm=False)
    assert outs[-1].num_cached_tokens == len(shared)
    for out in outs:
        assert_greedy_match(out.outputs[0].token_ids, *hf_greedy(model, out.prompt_token_ids, MAX_TOKENS))
