"""End to end on CUDA: the fast path (Triton attention, decode CUDA graphs, overlap scheduling) gives
the CPU torch backend's greedy tokens on the same weights, under the top-2 rule of tests/tolerance.py (bf16:
its looser tolerance). A random Qwen3-shaped model saved by transformers, so no model package is
needed on the GPU machine."""
from __future__ import annotations

import pytest
import torch

from folovllm import LLM, SamplingParams
from tests.tolerance import BF16_TOP2_TOLERANCE, TOP2_TOLERANCE, assert_greedy_match, logprob_gaps


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from folovllm.bench.gpu_runs import save_placeholder_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         max_position_embeddings=1024, initializer_range=0.1, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("qwen3_small")
    Qwen3ForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_placeholder_tokenizer(path)  # prompts are ids and nothing is detokenized
    return str(path)


def greedy_runs(model_dir: str, dtype: str, **engine_args) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and each step's top-2 logprob gap for a batch with chunked prefill, joins and
    finishes at different steps (so decode batches of many sizes replay their graphs)."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 2048, (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 300, (12,), generator=gen)]
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 4 * i, ignore_eos=True, logprobs=2,
                             detokenize=False) for i in range(12)]
    llm = LLM(model_dir, dtype=dtype, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8,
              num_gpu_blocks_override=512, seed=0, **engine_args)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(out.outputs[0].token_ids, logprob_gaps(out.outputs[0])) for out in outs]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", BF16_TOP2_TOLERANCE), ("float32", TOP2_TOLERANCE)])
def test_cuda_fast_path_matches_cpu_torch_backend(qwen3_dir, dtype, tolerance):
    reference = greedy_runs(qwen3_dir, dtype, device="cpu", attention_backend="torch")
    ours = greedy_runs(qwen3_dir, dtype, device="cuda")  # auto: triton, CUDA graphs, overlap
    for (tokens, _), (ref_tokens, ref_gaps) in zip(ours, reference):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, tolerance)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_launching_a_step_never_waits_for_the_device(qwen3_dir):
    """Overlap only pays if launch() queues work without a host sync: CUDA's sync debug mode turns
    any sync (a blocking copy, .item(), .tolist()) inside launch into an error."""
    llm = LLM(qwen3_dir, dtype="bfloat16", device="cuda", max_model_len=512, max_num_batched_tokens=256,
              num_gpu_blocks_override=512)
    runner = llm.llm_engine.worker.runner
    launch = runner.launch

    def strict_launch(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    runner.launch = strict_launch
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False),
              SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=16, ignore_eos=True,
                             seed=1, detokenize=False),
              SamplingParams(temperature=1.0, top_k=5, max_tokens=16, ignore_eos=True, detokenize=False)]
    outs = llm.generate([{"prompt_token_ids": list(range(3, 3 + 40 * (i + 1)))} for i in range(3)], params,
                        use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [16, 16, 16]
    assert llm.llm_engine.overlap
