"""The CUDA platform's Triton kernel forms end to end, run on CPU tensors through Triton's interpreter: an engine
whose layers call them gives the torch backend's greedy tokens (Qwen3, q/k norms included: fp32 exactly, bf16
by the top-2 rule), and FOLOVLLM_CUDA_FUSED_OPS decides whether the CUDA platform hands them out."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from folovllm import SamplingParams
from folovllm.model.layers import Attention, GatedMLP, RMSNorm
from folovllm.platforms.cpu import CpuPlatform
from folovllm.platforms.cuda import CudaPlatform
from tests.engine.conftest import make_llm, random_prompts
from tests.helpers import switches, use_triton_interpreter_without_cuda
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()

from folovllm.platforms.triton_ops import triton_kernel_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from folovllm.bench.gpu_runs import save_placeholder_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         initializer_range=0.2, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("tiny_qwen3")
    Qwen3ForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_placeholder_tokenizer(path)
    return str(path)


def kernel_forms(model: torch.nn.Module) -> set[str | None]:
    """The op table's source of every norm, attention and MLP (None: its torch form)."""
    layers = [m for m in model.modules() if isinstance(m, (Attention, GatedMLP))
              or (isinstance(m, RMSNorm) and m.weight.numel() > 16)]  # q/k norms ride in the rotary op
    return {m.ops.source if m.ops is not None else None for m in layers}


def greedy(model_dir: str, dtype: str, triton_forms: bool, monkeypatch: pytest.MonkeyPatch, num_prompts: int = 3,
           **engine_args) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens (and each step's top-2 logprob gap) of a batch with chunked prefill and decode steps;
    ``triton_forms``: the layers built with the Triton op table (on a CPU: the CPU platform made to hand it out)."""
    with monkeypatch.context() as patch:
        if triton_forms and DEVICE == "cpu":
            patch.setattr(CpuPlatform, "kernel_ops", lambda self: triton_kernel_ops())
        with switches(CUDA_FUSED_OPS="on" if triton_forms else "off", CPU_FUSED_OPS="off"):
            llm = make_llm(model_dir, dtype=dtype, device=DEVICE, max_num_batched_tokens=8, **engine_args)
    assert kernel_forms(llm.llm_engine.worker.model) == ({"triton"} if triton_forms else {None})
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in random_prompts(num_prompts, seed=4, high=14)], params,
                        use_tqdm=False)
    runs = []
    for out in outs:
        top2 = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in out.outputs[0].logprobs]
        runs.append((out.outputs[0].token_ids, [a - b for a, b in top2]))
    return runs


def test_greedy_with_triton_forms_equals_the_torch_backend(tiny_qwen3_dir: str, monkeypatch) -> None:
    """Qwen3 (q/k norms in the rotary op; the op tests cover the forms without them)."""
    model_dir = tiny_qwen3_dir
    reference = greedy(model_dir, "float32", False, monkeypatch, attention_backend="torch")
    ours = greedy(model_dir, "float32", True, monkeypatch, attention_backend="triton")
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in reference]


def test_bf16_greedy_is_unchanged_with_the_triton_forms_off(tiny_qwen3_dir: str, monkeypatch) -> None:
    """bf16: a norm's sum of squares in another order may move a value by a rounding step, so tokens may part at
    a near-tie, which the top-2 rule tells from a bug."""
    off = greedy(tiny_qwen3_dir, "bfloat16", False, monkeypatch, num_prompts=2, attention_backend="triton")
    on = greedy(tiny_qwen3_dir, "bfloat16", True, monkeypatch, num_prompts=2, attention_backend="triton")
    for (tokens, _), (ref_tokens, ref_gaps) in zip(on, off):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, BF16_TOP2_TOLERANCE)


def test_the_switch_decides_what_the_cuda_platform_hands_out() -> None:
    with switches(CUDA_FUSED_OPS="on"):
        ops = CudaPlatform(torch.device("cuda")).kernel_ops()
    assert ops is not None and ops.source == "triton"
    with switches(CUDA_FUSED_OPS="off"):
        assert CudaPlatform(torch.device("cuda")).kernel_ops() is None
