"""Greedy tokens on CUDA equal transformers' on the same GPU and weights: tiny Qwen3 and Llama models built
with transformers' own classes, fp32 and bf16, a batch with chunked prefill (the fast path's Triton
attention, decode CUDA graphs and overlap scheduling all run). A mismatch only counts where transformers'
own top-2 logprobs are apart (tests/tolerance.py). The CPU case runs the same code in the GPU check's
rehearsal (`make gpu-rehearsal`, under the GPU image's versions), so the GPU run cannot fail on the test itself."""
from __future__ import annotations

import pytest
import torch

from folovllm import LLM, SamplingParams
from tests.tolerance import BF16_TOP2_TOLERANCE, TOP2_TOLERANCE, assert_greedy_match, top2_gaps

SHAPE = dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, initializer_range=0.1,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
NUM_NEW_TOKENS = 16
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def model_dir(request, tmp_path_factory) -> str:
    import transformers

    from folovllm.bench.gpu_runs import save_placeholder_tokenizer

    config_cls, model_cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                             "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[request.param]
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    model_cls(config_cls(**SHAPE)).eval().save_pretrained(path, safe_serialization=True)
    save_placeholder_tokenizer(path)  # prompts are ids and nothing is detokenized
    return str(path)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, SHAPE["vocab_size"], (int(n),), generator=gen).tolist()
            for n in torch.randint(4, 200, (6,), generator=gen)]


def transformers_greedy(model_dir: str, dtype: torch.dtype, device: str) -> list[tuple[list[int], list[float]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True).to(device).eval()
    runs = []
    for prompt in prompts():
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NUM_NEW_TOKENS, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        runs.append((out.sequences[0, ids.shape[1]:].tolist(), top2_gaps([s.cpu() for s in out.logits])))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return runs


@pytest.mark.parametrize("device, dtype", [
    pytest.param("cpu", torch.float32, marks=pytest.mark.slow),  # scripts/gpu_check.sh runs it, as does test-all
    pytest.param("cuda", torch.float32, marks=needs_cuda),
    pytest.param("cuda", torch.bfloat16, marks=needs_cuda),
], ids=["cpu-fp32", "cuda-fp32", "cuda-bf16"])
def test_greedy_matches_transformers_on_the_same_device(model_dir: str, device: str, dtype: torch.dtype) -> None:
    reference = transformers_greedy(model_dir, dtype, device)
    llm = LLM(model_dir, dtype=str(dtype).removeprefix("torch."), device=device, max_model_len=512,
              max_num_batched_tokens=128, max_num_seqs=4, num_gpu_blocks_override=256, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts()], params, use_tqdm=False)
    tolerance = BF16_TOP2_TOLERANCE if dtype == torch.bfloat16 else TOP2_TOLERANCE
    for out, (ref_tokens, ref_gaps) in zip(outs, reference):
        assert_greedy_match(out.outputs[0].token_ids, ref_tokens, ref_gaps, tolerance)
