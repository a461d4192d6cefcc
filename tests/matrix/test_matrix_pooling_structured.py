"""The feature matrix, pooling and structured outputs: LAST and MEAN embeddings against transformers' hidden
states on the same device (cosine >= 0.9999), a cross-encoder's scores against transformers' head, and a JSON
schema and a regex obeyed by greedy decoding under xgrammar. CPU twins here; CUDA cases in the GPU check."""
from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from folovllm import PoolingParams, StructuredOutputsParams
from tests.matrix.engines import DEVICES, engine, greedy, token_prompts, with_tokenizer
from tests.pooling.conftest import VOCAB, hf_hidden_states
from tests.pooling.test_cross_encoder import DOCS, QUERY, cross_encoder, hf_scores  # noqa: F401
from tests.pooling.test_pooling_vs_hf import cosine
from tests.structured_output.test_structured_generate import SCHEMA

PROMPTS = token_prompts(4, seed=0, low=2, high=60, vocab=VOCAB)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
@pytest.mark.parametrize("device", DEVICES)
def test_embeddings_equal_transformers_hidden_states(embed_dir: str, device: str, pooling_type: str) -> None:
    reference = hf_hidden_states(embed_dir, PROMPTS, device)
    llm = engine(embed_dir, device, runner="pooling", max_num_batched_tokens=32,  # longer prompts are chunked
                 pooler_config={"pooling_type": pooling_type, "normalize": False})
    outputs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    for out, hidden in zip(outputs, reference):
        expected = hidden[-1] if pooling_type == "LAST" else hidden.mean(dim=0)
        assert cosine(out.outputs.embedding, expected) >= 0.9999
        assert torch.allclose(torch.tensor(out.outputs.embedding), expected, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_encoder_scores_equal_transformers(cross_encoder, default_tokenizer_dir, tmp_path,  # noqa: F811
                                                 device: str) -> None:
    path, model = cross_encoder
    path = with_tokenizer(path, default_tokenizer_dir, tmp_path / "cross_encoder")
    llm = engine(path, device, runner="pooling")
    expected = hf_scores(copy.deepcopy(model).to(device), llm.tokenizer, [(QUERY, doc) for doc in DOCS])
    scores = [o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)]
    assert scores == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="cross-encoder"):
        llm.score(QUERY, DOCS, pooling_params=PoolingParams(dimensions=8), use_tqdm=False)


@pytest.mark.parametrize("device", DEVICES)
def test_a_json_schema_and_a_regex_are_obeyed(llama_dir: str, device: str) -> None:
    llm = engine(llama_dir, device)
    prompts = [{"prompt_token_ids": p} for p in token_prompts(3, seed=5, low=4, high=30, vocab=512)]
    schema = greedy(60, ignore_eos=False, structured_outputs=StructuredOutputsParams(json=SCHEMA,
                                                                                      disable_any_whitespace=True))
    for out in llm.generate(prompts, schema, use_tqdm=False):
        value = json.loads(out.outputs[0].text)
        assert value["kind"] in ("cat", "dog") and isinstance(value["ok"], bool)
        assert out.outputs[0].finish_reason == "stop"
    pattern = r"[a-z]{6}-[0-9]{3}"
    regex = greedy(30, ignore_eos=False, structured_outputs=StructuredOutputsParams(regex=pattern))
    for out in llm.generate(prompts, regex, use_tqdm=False):
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
