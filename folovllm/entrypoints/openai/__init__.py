"""The OpenAI-compatible HTTP server (``folovllm serve``): FastAPI routes over AsyncLLMEngine."""
