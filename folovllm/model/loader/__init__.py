"""From a model path to a loaded model: config, checkpoint formats (GGUF, safetensors, dummy), the hub's
local cache, the tokenizer and generation config."""
from folovllm.model.loader.loader import default_model_path, load_arch_config, load_model, resolve_quantization

__all__ = ["default_model_path", "load_arch_config", "load_model", "resolve_quantization"]
