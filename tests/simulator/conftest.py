"""A tiny random Llama for the replay tests (the engine runs it; the simulator replays its steps)."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm.bench.gpu_runs import save_tokenizer


@pytest.fixture(scope="session")
def replay_model_dir(tmp_path_factory) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("replay_llama")
    LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return str(path)
