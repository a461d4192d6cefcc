"""Batch-invariant mode (``batch_invariant=True``): a request's tokens and logprobs are the same bits alone as
inside any batch (shuffled, mixed lengths, a prefill chunk small enough to split it), after preemption, on a
prefix-cache hit or miss, with n-gram speculation on or off, with seeded sampling, with overlap scheduling;
at every CPU tier this host has, in bfloat16 and float32, on a tiny Llama and a held-out tiny Qwen3 (q/k
norms); the default model in one case (all tiers: the slow twin). Floats are compared with ``==``. The
inverse test shows the default mode does differ."""
from __future__ import annotations

import random

import pytest
import torch

from folovllm import LLM, SamplingParams
from folovllm.bench.gpu_runs import save_tokenizer
from tests.engine.conftest import tiny_llama_dir  # noqa: F401

VOCAB = 512
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# the needles' settings: logprobs (and the prompt's) on a greedy row, a plain greedy row (alone, the LM head's argmax; in a
# batch beside logprob rows, the sampler's), a seeded random row with logprobs
NEEDLE_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=2),
    SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7, max_tokens=8, ignore_eos=True, logprobs=2),
]


def tiny_checkpoint(folder, arch: str) -> str:
    """A tiny random model of transformers' own classes (head_dim 64 and weights our linear kernel takes)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    shape = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                 eos_token_id=2, bos_token_id=1)
    config = LlamaConfig(**shape, tie_word_embeddings=False) if arch == "llama" else \
        Qwen3Config(**shape, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # wide logits: greedy tokens are far from ties, logprobs far from each other
        for name, param in model.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.15 * torch.randn_like(param))
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    return {arch: tiny_checkpoint(tmp_path_factory.mktemp(arch), arch) for arch in ("llama", "qwen3")}


def make(model: str, **kwargs) -> LLM:
    settings = dict(dtype="float32", block_size=4, max_model_len=256, num_gpu_blocks_override=600,
                    max_num_batched_tokens=16, enable_prefix_caching=False, batch_invariant=True)
    settings.update(kwargs)
    return LLM(model, **settings)


def prompts(count: int, rng: random.Random, low: int = 3, high: int = 90) -> list[list[int]]:
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(low, high))] for _ in range(count)]


def fingerprint(output) -> tuple:
    """A completion's tokens and every logprob it reports (its prompt's too), as exact floats."""
    def entries(steps) -> tuple:
        return tuple(None if step is None else tuple(sorted((token, lp.logprob, lp.rank) for token, lp in step.items()))
                     for step in steps or ())

    completion = output.outputs[0]
    return tuple(completion.token_ids), entries(completion.logprobs), entries(output.prompt_logprobs)


def generate(llm: LLM, batch: list[tuple[list[int], SamplingParams]], loras: list | None = None) -> list[tuple]:
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in batch], [s for _, s in batch], use_tqdm=False,
                        lora_request=loras)
    return [fingerprint(o) for o in outs]


def other_params(rng: random.Random) -> SamplingParams:
    """The company's settings: greedy or random (seeded or not), logprobs or not, short or long."""
    kind = rng.randrange(4)
    tokens = rng.randrange(1, 14)
    if kind == 0:
        return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    if kind == 1:
        return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=rng.randrange(1, 5))
    seed = rng.randrange(1000) if kind == 2 else None
    return SamplingParams(temperature=1.0, top_p=0.8, seed=seed, max_tokens=tokens, ignore_eos=True, logprobs=1)


def needles_in_batches(llm: LLM, needles: list[list[int]], sizes: tuple[int, ...], seed: int = 0,
                       params: list[SamplingParams] = NEEDLE_PARAMS) -> list[list[tuple]]:
    """Each batch's outputs for the needles (in needle order): the needles shuffled among random company."""
    rng = random.Random(seed)
    results = []
    for size in sizes:
        batch = [(n, p, i) for i, (n, p) in enumerate(zip(needles, params))]
        batch += [(p, other_params(rng), None) for p in prompts(size - len(needles), rng)]
        rng.shuffle(batch)
        outs = generate(llm, [(p, s) for p, s, _ in batch])
        results.append([out for i in range(len(needles)) for out, (_, _, j) in zip(outs, batch) if j == i])
    return results


def alone(llm: LLM, needles: list[list[int]], params: list[SamplingParams] = NEEDLE_PARAMS) -> list[tuple]:
    return [generate(llm, [(n, p)])[0] for n, p in zip(needles, params)]


NEEDLES = prompts(3, random.Random(1), low=20, high=60)


@pytest.mark.parametrize("sizes", [(12,), pytest.param((8, 24, 64), marks=pytest.mark.slow)], ids=["12", "8-24-64"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_alone_equals_inside_any_batch(tiny_models, arch: str, dtype: str, sizes: tuple[int, ...],
                                       engine_tier: str) -> None:
    llm = make(tiny_models[arch], dtype=dtype)
    reference = alone(llm, NEEDLES)
    assert reference[0][1] and reference[0][2]  # logprobs were reported, the prompt's too
    for outputs in needles_in_batches(llm, NEEDLES, sizes=sizes):
        assert outputs == reference


@pytest.mark.parametrize("chunk", [5, 13, 64])
def test_any_chunk_size_any_mix(tiny_models, chunk: int) -> None:
    reference = alone(make(tiny_models["llama"], dtype="bfloat16", max_num_batched_tokens=256), NEEDLES)
    llm = make(tiny_models["llama"], dtype="bfloat16", max_num_batched_tokens=chunk, max_num_seqs=6)
    for outputs in needles_in_batches(llm, NEEDLES, sizes=(12,), seed=chunk):
        assert outputs == reference


def test_preemption_and_recompute(tiny_models) -> None:
    model = tiny_models["qwen3"]
    reference = alone(make(model, dtype="bfloat16"), NEEDLES)
    llm = make(model, dtype="bfloat16", num_gpu_blocks_override=32, max_model_len=128)
    assert needles_in_batches(llm, NEEDLES, sizes=(10,), seed=3)[0] == reference
    assert llm.llm_engine.scheduler.num_preemptions > 0


def test_prefix_cache_hit_equals_miss(tiny_models) -> None:
    model = tiny_models["llama"]
    miss = alone(make(model, dtype="bfloat16"), NEEDLES)
    llm = make(model, dtype="bfloat16", enable_prefix_caching=True)
    # earlier requests share each needle's first blocks (and the needles themselves, the second time)
    generate(llm, [(n[:len(n) // 2 + 3], SamplingParams(max_tokens=2)) for n in NEEDLES])
    hits = llm.llm_engine.kv_cache.prefix_cache_hits
    assert alone(llm, NEEDLES) == miss
    assert needles_in_batches(llm, NEEDLES, sizes=(8,), seed=4)[0] == miss
    assert llm.llm_engine.kv_cache.prefix_cache_hits > hits


def test_speculative_decoding_on_equals_off(tiny_llama_dir: str) -> None:  # noqa: F811
    """n-gram proposals verified as rows of several new tokens: the same bits as decoding them one by one."""
    model = tiny_llama_dir  # (small weights: from these prompts it repeats phrases, so proposals are accepted)
    grounded = [p * 3 for seed in (0, 2, 3) for p in prompts(1, random.Random(seed), low=4, high=10)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=n) for n in (2, None, 1)]
    reference = alone(make(model, dtype="bfloat16"), grounded, params)
    llm = make(model, dtype="bfloat16", speculative_config=NGRAM)
    assert alone(llm, grounded, params) == reference
    assert needles_in_batches(llm, grounded, sizes=(8,), seed=6, params=params)[0] == reference
    assert llm.llm_engine.stats.spec_decode_num_accepted_tokens > 0


def test_overlap_scheduling(tiny_models) -> None:
    model = tiny_models["qwen3"]
    reference = alone(make(model, dtype="bfloat16"), NEEDLES)
    llm = make(model, dtype="bfloat16", overlap_scheduling=True)
    assert needles_in_batches(llm, NEEDLES, sizes=(8,), seed=7)[0] == reference


def test_lora_adapters(tiny_models, tmp_path) -> None:
    """Rows of two adapters and of the base model in one batch: each needle as alone (the lora_add kernel
    adds each row's delta on its own)."""
    from transformers import AutoConfig

    from folovllm import LoRARequest
    from tests.lora.adapters import ATTN, MLP, write_adapter

    model = tiny_models["llama"]
    config = AutoConfig.from_pretrained(model)
    adapters = [LoRARequest(f"a{i}", i, str(write_adapter(tmp_path / f"a{i}", config, 8, ATTN + MLP, seed=i,
                                                            std=0.05))) for i in (1, 2)]
    llm = make(model, dtype="bfloat16", enable_lora=True, max_loras=2, max_lora_rank=8)
    mine = [adapters[i % 2] for i in range(len(NEEDLES))]
    reference = [generate(llm, [(n, p)], [lora])[0] for n, p, lora in zip(NEEDLES, NEEDLE_PARAMS, mine)]
    assert generate(llm, [(NEEDLES[0], NEEDLE_PARAMS[0])])[0] != reference[0]  # the adapter counts
    rng = random.Random(9)
    company = [(p, other_params(rng), rng.choice([None, *adapters])) for p in prompts(9, rng)]
    batch = [(n, p, lora) for n, p, lora in zip(NEEDLES, NEEDLE_PARAMS, mine)] + company
    order = list(range(len(batch)))
    rng.shuffle(order)
    outs = generate(llm, [batch[i][:2] for i in order], [batch[i][2] for i in order])
    assert [outs[order.index(i)] for i in range(len(NEEDLES))] == reference


def test_the_start_up_log_and_metrics_say_the_mode_is_on(tiny_models, caplog) -> None:
    from folovllm.entrypoints.openai.metrics import ServerMetrics

    with caplog.at_level("INFO", logger="folovllm.engine.llm_engine"):
        llm = make(tiny_models["llama"])
    assert any("batch_invariant=on" in r.getMessage() for r in caplog.records if "platform:" in r.getMessage())
    assert "batch_invariant" not in make(tiny_models["llama"], batch_invariant=False).llm_engine.platform_info
    text = ServerMetrics("tiny", platform=llm.llm_engine.platform_info).render().decode()
    assert 'batch_invariant="on"' in next(line for line in text.splitlines() if line.startswith("folovllm:platform_info"))


def test_default_mode_differs(tiny_models, engine_tier: str) -> None:
    """The inverse: without the mode the same needles move with their company (the batch's shape picks
    other kernels and orders: a prompt chunk's prefill kernel or SDPA instead of the decode rows' form,
    a GEMM's blocking by row count), so at least one logprob differs."""
    llm = make(tiny_models["llama"], dtype="float32", batch_invariant=False)
    reference = alone(llm, NEEDLES)
    assert any(outputs != reference for outputs in needles_in_batches(llm, NEEDLES, sizes=(12,)))


def default_model_case() -> None:
    """The default model (SmolLM2-135M, its auto dtype: bfloat16 where that is fast), needles split by
    16-token chunks, inside a batch of 8."""
    from folovllm.model.loader import default_model_path

    try:
        path = default_model_path()
    except ValueError as err:
        pytest.skip(str(err))
    llm = LLM(path, max_num_batched_tokens=16, max_model_len=256, enable_prefix_caching=False, batch_invariant=True)
    needles = prompts(3, random.Random(2), low=10, high=40)
    reference = alone(llm, needles)
    assert needles_in_batches(llm, needles, sizes=(8,), seed=8)[0] == reference


def test_default_model() -> None:
    default_model_case()


@pytest.mark.slow
def test_default_model_at_each_tier(engine_tier: str) -> None:
    default_model_case()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda(tiny_models) -> None:
    """On a GPU: the fixed-tile Triton GEMMs and row reductions over aten's, the triton attention's fixed
    tiles, decode steps replayed from CUDA graphs."""
    llm = make(tiny_models["qwen3"], device="cuda", dtype="bfloat16", attention_backend="triton")
    reference = alone(llm, NEEDLES)
    for outputs in needles_in_batches(llm, NEEDLES, sizes=(8, 24)):
        assert outputs == reference
