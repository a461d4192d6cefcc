import pytest


@pytest.fixture(scope="session")
def smol_llm():
    """The embedded default model (SmolLM2-135M-Instruct GGUF) in float32, loaded once."""
    from folovllm import LLM

    return LLM(dtype="float32", max_model_len=512, kv_cache_memory="256MiB", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random Llama with the default model's tokenizer, for servers with several processes
    (tensor- and data-parallel, prefill/decode disaggregation) and tests of plumbing rather than
    numerics: starts fast, and a prompt's tokens all exist in its vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from folovllm.bench.gpu_runs import save_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny_serve_model")
    LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)  # the default model's tokenizer: its 49152 ids match the vocabulary above
    return str(path)
