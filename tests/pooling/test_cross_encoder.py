"""A cross-encoder (*ForSequenceClassification, one label) scores each text pair through its head, as
transformers does on the same weights (fp32): the pair tokenized as one input, the last token's logit
through a sigmoid."""
import httpx
import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from folovllm import LLM, PoolingParams
from folovllm.bench.gpu_runs import save_tokenizer
from folovllm.engine.pooling import model_pooling
from tests.entrypoints.openai.conftest import ServerProcess

QUERY, DOCS = "what is the capital of France", ["Paris is the capital of France", "bananas are yellow", "x"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, num_labels=1, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForSequenceClassification(config).eval()
    path = tmp_path_factory.mktemp("cross_encoder")
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return str(path), model


def hf_scores(model, tokenizer, pairs) -> list[float]:
    """transformers' score of each pair, on the model's device."""
    with torch.no_grad():
        ids = [torch.tensor([tokenizer(a, b)["input_ids"]], device=model.device) for a, b in pairs]
        return [torch.sigmoid(model(pair).logits[0, 0]).item() for pair in ids]


def test_scores_match_hf_and_embeddings_are_refused(cross_encoder):
    path, model = cross_encoder
    llm = LLM(path, runner="pooling", dtype="float32", max_model_len=256, num_gpu_blocks_override=64,
              block_size=4, max_num_batched_tokens=8)  # pairs of 9-14 tokens: chunked
    expected = hf_scores(model, llm.tokenizer, [(QUERY, d) for d in DOCS])
    assert [o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)] == pytest.approx(expected, abs=1e-5)
    pairwise = llm.score([QUERY, DOCS[1]], [DOCS[0], DOCS[2]], use_tqdm=False)
    assert [o.outputs.score for o in pairwise] == pytest.approx(
        hf_scores(model, llm.tokenizer, [(QUERY, DOCS[0]), (DOCS[1], DOCS[2])]), abs=1e-5)
    with pytest.raises(ValueError, match="cross-encoder"):
        llm.embed(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match="cross-encoder"):
        llm.score(QUERY, DOCS, pooling_params=PoolingParams(dimensions=8), use_tqdm=False)


def test_a_cross_encoder_needs_the_pooling_runner(tmp_path):
    with pytest.raises(ValueError, match="runner='pooling'"):
        model_pooling("generate", None, str(tmp_path), "Qwen3ForSequenceClassification")
    with pytest.raises(ValueError, match="LAST"):
        model_pooling("pooling", {"pooling_type": "MEAN"}, str(tmp_path), "LlamaForSequenceClassification")
    pooler, is_cross_encoder = model_pooling("pooling", None, str(tmp_path), "LlamaForSequenceClassification")
    assert is_cross_encoder and not pooler.normalize


@pytest.mark.slow
def test_served_rerank_and_score(cross_encoder):
    path, model = cross_encoder
    proc = ServerProcess("--model", path, "--runner", "pooling")
    try:
        proc.wait_ready()
        from folovllm.model.loader.tokenizer import load_tokenizer

        expected = hf_scores(model, load_tokenizer(path), [(QUERY, d) for d in DOCS])
        reranked = httpx.post(f"{proc.base_url}/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60).json()
        assert [r["relevance_score"] for r in reranked["results"]] == pytest.approx(sorted(expected, reverse=True),
                                                                                     abs=1e-5)
        scores = httpx.post(f"{proc.base_url}/score", json={"text_1": QUERY, "text_2": DOCS}, timeout=60).json()
        assert [d["score"] for d in scores["data"]] == pytest.approx(expected, abs=1e-5)
        assert httpx.post(f"{proc.base_url}/v1/embeddings", json={"input": "x"}, timeout=60).status_code == 400
    finally:
        proc.stop()
        proc.kill()
