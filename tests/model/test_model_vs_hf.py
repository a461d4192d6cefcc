"""Our model code vs transformers' own classes on tiny random checkpoints, through the paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from tests.helpers import BlockPool, make_attn_metadata

torch.set_num_threads(2)

BLOCK_SIZE = 4
NUM_BLOCKS = 64
TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    eos_token_id=2,
)
CONFIGS = {
    # tied embeddings and llama3 rope scaling exercise those paths on the Llama case
    "llama": lambda: LlamaConfig(
        **TINY,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "qwen2": lambda: Qwen2Config(**TINY, rope_theta=1e6),
    "qwen3": lambda: Qwen3Config(**TINY, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    """A tiny transformers model with non-trivial random weights, saved as safetensors."""
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    hf_model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # larger than the default init, so logits are far from ties
        for name, param in hf_model.named_parameters():
            noise = 0.1 * torch.randn_like(param)
            param.copy_(1 + noise if "norm" in name else noise)
    path = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(path, safe_serialization=True)
    return path, hf_model


@dataclass
class Seq:
    """One sequence driven through our model: its tokens, what is cached, and its block table."""

    tokens: list[int]
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)


def new_kv_caches(model: CausalLM) -> list[tuple[torch.Tensor, torch.Tensor]]:
    arch = model.arch
    shape = (NUM_BLOCKS, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(arch.num_hidden_layers)]


def run_step(
    model: CausalLM, kv_caches: list, pool: BlockPool, seqs: list[Seq], num_new: list[int]
) -> list[torch.Tensor]:
    """Compute num_new[i] more tokens of each sequence in ONE forward; returns each one's logits."""
    ids, positions = [], []
    for seq, n in zip(seqs, num_new):
        start = seq.num_computed
        ids += seq.tokens[start : start + n]
        positions += range(start, start + n)
        seq.num_computed += n
        pool.grow(seq.block_table, seq.num_computed, BLOCK_SIZE)
    seq_lens = [s.num_computed for s in seqs]
    meta = make_attn_metadata(num_new, seq_lens, [s.block_table for s in seqs], BLOCK_SIZE)
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.tensor(positions), kv_caches, meta)
        logits = model.compute_logits(hidden)
    return list(logits.split(num_new))


def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([tokens])).logits[0].float()


def test_prefill_and_decode_match_hf(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, hf_model = checkpoint
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    kv_caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS)
    seq = Seq(tokens=[5, 17, 200, 3, 99, 42, 7, 128, 64, 250, 11])

    (logits,) = run_step(model, kv_caches, pool, [seq], [len(seq.tokens)])
    torch.testing.assert_close(logits, hf_logits(hf_model, seq.tokens), atol=1e-4, rtol=1e-4)
    for _ in range(32):
        seq.tokens.append(int(logits[-1].argmax()))
        (logits,) = run_step(model, kv_caches, pool, [seq], [1])
        expected = hf_logits(hf_model, seq.tokens)[-1:]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        assert int(logits[-1].argmax()) == int(expected[-1].argmax())


def test_chunked_prefill_with_decode_in_one_batch(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, hf_model = checkpoint
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    prompt_a, prompt_b = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [100, 101, 102, 103, 104, 105]

    # separately: A in two chunks (6 + 4 tokens), B prefilled then one decode step
    caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS, seed=1)
    a = Seq(list(prompt_a))
    run_step(model, caches, pool, [a], [6])
    (alone_a,) = run_step(model, caches, pool, [a], [4])
    b = Seq(list(prompt_b))
    (b_prefill,) = run_step(model, caches, pool, [b], [6])
    b.tokens.append(int(b_prefill[-1].argmax()))
    (alone_b,) = run_step(model, caches, pool, [b], [1])

    # together: A's second chunk (over 6 cached tokens) and B's decode in the same forward
    caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS, seed=2)
    a2, b2 = Seq(list(prompt_a)), Seq(list(b.tokens))
    run_step(model, caches, pool, [b2, a2], [6, 6])
    mixed_a, mixed_b = run_step(model, caches, pool, [a2, b2], [4, 1])

    torch.testing.assert_close(mixed_a, alone_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed_b, alone_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed_a, hf_logits(hf_model, prompt_a)[6:], atol=1e-4, rtol=1e-4)
