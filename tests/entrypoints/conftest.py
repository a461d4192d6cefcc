import pytest


@pytest.fixture(scope="session")
def smol_llm():
    """The embedded default model (SmolLM2-135M-Instruct GGUF) in float32, loaded once."""
    from folovllm import LLM

    return LLM(dtype="float32", max_model_len=512, kv_cache_memory="256MiB", seed=0)
