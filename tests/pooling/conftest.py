"""A tiny random Llama (the default model's vocabulary, so text prompts tokenize into it) for pooling tests."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm.bench.gpu_runs import save_tokenizer

VOCAB = 49152


@pytest.fixture(scope="session")
def tiny_embed_dir(tmp_path_factory) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny_embed")
    LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return str(path)


def random_prompts(count: int, seed: int = 0, low: int = 2, high: int = 60) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def hf_hidden_states(model_dir: str, prompts: list[list[int]], device: str = "cpu") -> list[torch.Tensor]:
    """transformers' final normed hidden states of each prompt, one at a time, in float32 on ``device``
    (returned on the CPU)."""
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        return [model.model(torch.tensor([p], device=device)).last_hidden_state[0].cpu() for p in prompts]
