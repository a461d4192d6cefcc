"""The fused ops switch (FOLOVLLM_CPU_FUSED_OPS) end to end: it reaches the layers, the forward is unchanged
(fp32 within 1e-5, Llama and Qwen3's q/k norm), greedy tokens do not change with it, and a platform without
the kernels keeps the torch forms."""
import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from folovllm import LLM, SamplingParams
from folovllm.model.layers import Attention, GatedMLP, RMSNorm
from folovllm.platforms import kernel_library, platform_for
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.helpers import cpu_model, make_attn_metadata, switches
from tests.tiers import library_missing
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match

NOT_BUILT = library_missing()
needs_library = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
TINY = dict(vocab_size=256, hidden_size=96, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def fused_layers(model: torch.nn.Module) -> set[bool]:
    """For every norm, attention and MLP: whether it runs its kernel form (the fused op)."""
    found = set()
    for m in model.modules():
        if isinstance(m, RMSNorm) and m.weight.numel() > 16:  # q/k norms ride in the rotary op
            found.add(m.kernel_form)
        elif isinstance(m, (Attention, GatedMLP)):
            found.add(m.kernel_form)
    return found


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = (LlamaConfig if request.param == "llama" else Qwen3Config)(**TINY)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


@needs_library
def test_forward_is_unchanged_in_fp32(checkpoint: str) -> None:
    """Two steps (a ragged prefill, then decodes over the cache) with the fused ops on and off."""
    models = {fused: cpu_model(checkpoint, torch.float32, {"CPU_FUSED_OPS": "on" if fused else "off",
                                                           "CPU_DECODER": "modules"})
              for fused in (True, False)}
    assert fused_layers(models[True]) == {True} and fused_layers(models[False]) == {False}
    arch = models[True].arch
    caches = {fused: [(torch.zeros(32, 4, arch.num_key_value_heads, arch.head_dim),
                       torch.zeros(32, 4, arch.num_key_value_heads, arch.head_dim))
                      for _ in range(arch.num_hidden_layers)] for fused in models}
    gen = torch.Generator().manual_seed(0)
    steps = [([5, 9], [5, 9]), ([1, 1], [6, 10])]  # (query_lens, seq_lens)
    for query_lens, seq_lens in steps:
        meta = make_attn_metadata(query_lens, seq_lens, [[0, 1, 2], [3, 4, 5]], block_size=4)
        ids = torch.randint(0, arch.vocab_size, (sum(query_lens),), generator=gen)
        positions = torch.cat([torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens)])
        with torch.inference_mode():
            logits = {fused: model.compute_logits(model(ids, positions, caches[fused], meta))
                      for fused, model in models.items()}
        torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
        assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
    for (k_on, v_on), (k_off, v_off) in zip(caches[True], caches[False]):
        torch.testing.assert_close(k_on, k_off, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_on, v_off, rtol=1e-5, atol=1e-5)


@needs_library
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_switch_reaches_the_model_and_keeps_greedy_tokens(tiny_llama_dir, dtype: str) -> None:  # noqa: F811
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, seed=3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for fused in (True, False):
        with switches(CPU_FUSED_OPS="on" if fused else "off"):
            llm = make_llm(tiny_llama_dir, dtype=dtype, max_num_batched_tokens=32)
        assert fused_layers(llm.llm_engine.worker.model) == {fused}
        tokens[fused] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens[True] == tokens[False]


def test_a_platform_without_the_kernels_keeps_the_torch_forms(monkeypatch) -> None:
    with switches(CPU_ISA="none"):  # no kernel of ours at this tier
        assert not platform_for("cpu").fused_ops
    with switches(CPU_FUSED_OPS="off"):
        assert not platform_for("cpu").fused_ops
    monkeypatch.setattr(kernel_library, "has_kernel", lambda name: False)  # a library without them
    assert not platform_for("cpu").fused_ops


@needs_library
@pytest.mark.slow
def test_default_model_greedy_tokens_with_and_without_fused_ops() -> None:
    """bf16: a norm's sum order or exp's last ulp may differ from torch's, so a near-tie (a top-2 gap of 0 in
    bf16 logprobs) can flip a token after which the outputs part ways; tests/tolerance.py's top-2 rule tells such a flip from a bug."""
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1.",
               "Summarize: " + " ".join(f"Item {i} is a {c} box." for i, c in enumerate(["red", "blue"] * 10))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for fused in (True, False):
        with switches(CPU_FUSED_OPS="on" if fused else "off"):
            llm = LLM(dtype="bfloat16", device="cpu", max_model_len=256, kv_cache_memory="64MiB",
                      max_num_batched_tokens=64)
        assert fused_layers(llm.llm_engine.worker.model) == {fused}
        runs[fused] = []
        for out in llm.generate(prompts, params, use_tqdm=False):
            top2 = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in out.outputs[0].logprobs]
            runs[fused].append((out.outputs[0].token_ids, [a - b for a, b in top2]))
        del llm
    assert runs[True][0][0][:8] == runs[False][0][0][:8]  # no near-tie in the first tokens: they agree exactly
    for (tokens, _), (ref_tokens, ref_gaps) in zip(runs[True], runs[False]):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, BF16_TOP2_TOLERANCE)
