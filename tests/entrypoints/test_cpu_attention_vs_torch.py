"""The default model's greedy tokens through the cpu attention kernel equal the torch backend's
(under tests/tolerance.py's top-2 rule), with chunked prefill mixing decodes and prefill chunks."""
import pytest

from folovllm import LLM, SamplingParams
from tests.tiers import library_missing
from tests.tolerance import BF16_TOP2_TOLERANCE, TOP2_TOLERANCE, assert_greedy_match

NOT_BUILT = library_missing()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    # ~100 tokens: longer than one 64-key tile of the kernel, prefilled in three 48-token chunks
    "Summarize: " + " ".join(f"Item {i} is a {c} box." for i, c in enumerate(["red", "blue", "green"] * 4)),
]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)


def greedy_runs(dtype: str, backend: str) -> list[tuple[list[int], list[float]]]:
    """Token ids and top-2 logprob gaps per prompt, all prompts batched, prefills chunked."""
    llm = LLM(dtype=dtype, attention_backend=backend, max_model_len=512, kv_cache_memory="64MiB",
              max_num_batched_tokens=48, seed=0)
    runs = []
    for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False):
        completion = out.outputs[0]
        gaps = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in completion.logprobs]
        runs.append((completion.token_ids, [top[0] - top[1] for top in gaps]))
    return runs


@pytest.mark.parametrize("dtype, tolerance", [("float32", TOP2_TOLERANCE),
                                              pytest.param("bfloat16", BF16_TOP2_TOLERANCE, marks=pytest.mark.slow)])
def test_cpu_kernel_matches_torch_backend(dtype: str, tolerance: float) -> None:
    reference = greedy_runs(dtype, "torch")
    ours = greedy_runs(dtype, "cpu")
    for (tokens, _), (ref_tokens, ref_gaps) in zip(ours, reference):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, tolerance)
