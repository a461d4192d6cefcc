"""FoloVLLM: a small LLM inference and serving engine (continuous batching, paged KV cache)."""
from folovllm import envs

envs.cap_torch_kernels()  # before torch runs a kernel: a FOLOVLLM_CPU_ISA cap holds for torch's kernels too

from folovllm.beam_search import BeamSearchParams
from folovllm.inputs import PromptType, TextPrompt, TokensPrompt
from folovllm.lora.request import LoRARequest
from folovllm.outputs import (
    CompletionOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from folovllm.pooling_params import PoolingParams
from folovllm.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "BeamSearchParams", "RequestOutput",
           "CompletionOutput", "PromptType", "TextPrompt", "TokensPrompt", "PoolingParams",
           "EmbeddingRequestOutput", "PoolingRequestOutput", "ScoringRequestOutput", "LoRARequest"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in the model code and transformers; import it only when asked for.
    if name == "LLM":
        from folovllm.entrypoints.llm import LLM

        return LLM
    raise AttributeError(f"module 'folovllm' has no attribute {name!r}")
