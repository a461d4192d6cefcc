"""Tiny random models built with transformers' own classes: the exact reference for engine tests."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm.bench.gpu_runs import save_tokenizer

TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=2, bos_token_id=1, initializer_range=0.2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path, safe_serialization=True)
    # a fast-loading tokenizer.json next to the weights (a stand-in where the default model is absent)
    save_tokenizer(path)
    return str(path)


def make_llm(model_dir: str, **kwargs):
    from folovllm import LLM

    defaults = dict(dtype="float32", block_size=4, max_model_len=256, num_gpu_blocks_override=256)
    defaults.update(kwargs)
    return LLM(model_dir, **defaults)


def random_prompts(count: int, seed: int = 0, low: int = 3, high: int = 40) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return [torch.randint(3, TINY_VOCAB, (n,), generator=gen).tolist() for n in lengths]
