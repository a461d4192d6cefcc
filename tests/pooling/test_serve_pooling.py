"""A live `folovllm serve --runner pooling`: the openai and langchain clients' embeddings, /score, /rerank,
/pooling, and 4xx for what it cannot do (generation, bad inputs); embeddings on a generating server are a
400 too."""
import base64
import struct

import httpx
import pytest
import torch
import torch.nn.functional as F

from folovllm import LLM
from tests.entrypoints.openai.conftest import running_server

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a"]


@pytest.fixture(scope="module")
def server(tiny_embed_dir):
    with running_server("--model", tiny_embed_dir, "--runner", "pooling", "--max-num-batched-tokens", "8") as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny_embed_dir):
    """The same embeddings offline (same settings as the server's engine)."""
    llm = LLM(tiny_embed_dir, runner="pooling", dtype="float32", max_model_len=512, kv_cache_memory="256MiB")
    return [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]


def test_openai_client_embeddings(server, offline):
    import openai

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    response = client.embeddings.create(model="smol", input=TEXTS)  # the client asks for base64
    assert [d.index for d in response.data] == [0, 1, 2]
    for data, expected in zip(response.data, offline):
        assert torch.allclose(torch.tensor(data.embedding), torch.tensor(expected), atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 0
    short = client.embeddings.create(model="smol", input=TEXTS[0], dimensions=8, encoding_format="float")
    expected = F.normalize(torch.tensor(offline[0])[:8], dim=-1)  # truncated, then normalized again
    assert len(short.data[0].embedding) == 8
    assert torch.allclose(torch.tensor(short.data[0].embedding), expected, atol=1e-5)



def test_langchain_openai_embeddings(server, offline):
    """RAG frameworks call /v1/embeddings through langchain's OpenAIEmbeddings: documents and a query."""
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False sends the texts as they are (no tiktoken, which wants the internet)
    embedder = OpenAIEmbeddings(model="smol", base_url=f"{server.base_url}/v1", api_key="none",
                                check_embedding_ctx_length=False, max_retries=0)
    documents = embedder.embed_documents(TEXTS)
    assert len(documents) == len(TEXTS)
    for got, expected in zip(documents, offline):
        assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=1e-5)
    query = embedder.embed_query(TEXTS[1])
    assert torch.allclose(torch.tensor(query), torch.tensor(offline[1]), atol=1e-5)

def test_token_ids_base64_score_rerank_pooling(http, offline):
    body = http.post("/v1/embeddings", json={"input": [[1, 2, 3], [4, 5]], "encoding_format": "base64"}).json()
    raw = base64.b64decode(body["data"][1]["embedding"])
    assert len(struct.unpack(f"<{len(raw) // 4}f", raw)) == 64
    scores = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[:2]}).json()["data"]
    expected = F.cosine_similarity(torch.tensor(offline[0]), torch.tensor(offline[1]), dim=0).item()
    assert [s["score"] for s in scores] == pytest.approx([1.0, expected], abs=1e-5)
    assert http.post("/v1/score", json={"text_1": TEXTS[:2], "text_2": TEXTS[:2]}).status_code == 200
    reranked = http.post("/v1/rerank", json={"query": TEXTS[0], "documents": TEXTS, "top_n": 2}).json()
    assert reranked["results"][0]["index"] == 0 and len(reranked["results"]) == 2
    assert reranked["results"][0]["document"] == {"text": TEXTS[0]}
    bare = http.post("/v2/rerank", json={"query": "a", "documents": ["b"], "return_documents": False}).json()
    assert "document" not in bare["results"][0]
    pooled = http.post("/pooling", json={"input": TEXTS[0]}).json()["data"][0]["data"]
    assert torch.allclose(torch.tensor(pooled), torch.tensor(offline[0]), atol=1e-5)


@pytest.mark.parametrize(("path", "body", "says"), [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, "pooling model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "pooling model"),
    ("/v1/embeddings", {"input": []}, "empty"),
    ("/v1/embeddings", {"input": ""}, "empty"),
    ("/v1/embeddings", {"input": "x", "bogus": 1}, "bogus"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": 65}, "hidden size"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": [49152]}, "token ids"),
    ("/v1/embeddings", {"input": [[1], "x"]}, "input"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "N texts"),
    ("/rerank", {"query": "a", "documents": []}, "documents"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
])
def test_bad_requests_are_400_and_the_server_goes_on(http, path, body, says):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]["message"]
    assert http.post("/v1/embeddings", json={"input": "ok"}).status_code == 200


@pytest.mark.slow
def test_embeddings_on_a_generating_server_are_400(tiny_embed_dir):
    with running_server("--model", tiny_embed_dir) as proc:
        response = httpx.post(f"{proc.base_url}/v1/embeddings", json={"input": "hi"}, timeout=60)
        assert response.status_code == 400 and "runner='pooling'" in response.json()["error"]["message"]


def test_bench_serve_embeddings(server, tmp_path):
    import json

    from folovllm.entrypoints.cli import main

    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--base-url", server.base_url, "--endpoint-type", "embeddings",
                 "--dataset", "random", "--num-prompts", "4", "--input-len", "16", "--request-rate", "inf",
                 "--no-progress", "--output-json", str(out)]) == 0
    result = json.loads(out.read_text())[0]
    assert result["num_requests"] == 4 and result["input_tokens"] == 64 and result["output_tokens"] == 0
    assert result["request_throughput"] > 0 and result["input_tok_s"] > 0
