"""Embeddings of a pooling engine against transformers' final normed hidden states on the same weights (fp32):
several prompts of different lengths in one batch, chunked prefill over small step budgets."""
import pytest
import torch
import torch.nn.functional as F

from folovllm import LLM, PoolingParams
from tests.pooling.conftest import hf_hidden_states, random_prompts

PROMPTS = random_prompts(6)


@pytest.fixture(scope="module")
def reference(tiny_embed_dir):
    return hf_hidden_states(tiny_embed_dir, PROMPTS)


def make_pooling_llm(model_dir: str, **kwargs) -> LLM:
    settings = dict(runner="pooling", dtype="float32", block_size=4, max_model_len=256,
                    num_gpu_blocks_override=256, max_num_batched_tokens=16)  # prompts up to 59 tokens: 4 chunks
    settings.update(kwargs)
    return LLM(model_dir, **settings)


def cosine(a, b) -> float:
    return F.cosine_similarity(torch.tensor(a, dtype=torch.float32), b.float(), dim=-1).min().item()


def embed(llm: LLM, prompts, params: PoolingParams | None = None) -> list[list[float]]:
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    return [o.outputs.embedding for o in outputs]


def test_last_token_pooling_matches_hf_with_chunks_and_prefix_hits(tiny_embed_dir, reference):
    llm = make_pooling_llm(tiny_embed_dir)
    for _ in range(2):  # the second time the prompts' full blocks are prefix-cache hits
        for vector, hidden in zip(embed(llm, PROMPTS), reference):
            assert cosine(vector, hidden[-1]) >= 0.9999
            assert abs(torch.tensor(vector).norm().item() - 1.0) < 1e-5  # normalized by default
    assert llm.llm_engine.kv_cache.prefix_cache_hits > 0
    # Matryoshka: the first 16 components, normalized after truncation
    short = embed(llm, PROMPTS[:2], PoolingParams(dimensions=16))
    for vector, hidden in zip(short, reference):
        assert len(vector) == 16
        assert torch.allclose(torch.tensor(vector), F.normalize(hidden[-1][:16], dim=-1), atol=1e-4)
    raw = embed(llm, PROMPTS[:1], PoolingParams(normalize=False))[0]
    assert torch.allclose(torch.tensor(raw), reference[0][-1], atol=1e-4, rtol=1e-4)
    # score: one text against many, cosine of the embeddings
    query, docs = {"prompt_token_ids": PROMPTS[0]}, [{"prompt_token_ids": p} for p in PROMPTS[1:3]]
    scores = [o.outputs.score for o in llm.score(query, docs, use_tqdm=False)]
    expected = [F.cosine_similarity(reference[0][-1], h[-1], dim=0).item() for h in reference[1:3]]
    assert scores == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="does not generate"):
        llm.generate(["hello"], use_tqdm=False)


def test_mean_pooling_matches_hf_over_chunks(tiny_embed_dir, reference):
    llm = make_pooling_llm(tiny_embed_dir, pooler_config={"pooling_type": "mean", "normalize": False},
                           max_num_batched_tokens=24)
    for _ in range(2):  # MEAN reads every row: the second round takes no prefix-cache hits
        for vector, hidden in zip(embed(llm, PROMPTS), reference):
            assert cosine(vector, hidden.mean(dim=0)) >= 0.9999
            assert torch.allclose(torch.tensor(vector), hidden.mean(dim=0), atol=1e-4, rtol=1e-4)
    cls_like = llm.encode([{"prompt_token_ids": PROMPTS[0]}], use_tqdm=False)[0].outputs.data
    assert cls_like.shape == (64,)


def test_sentence_transformers_folder_of_a_bare_decoder(tiny_embed_dir, reference, tmp_path):
    """The decoder saved alone (no ``model.`` prefix, no head, untied) with sentence-transformers' modules:
    mean pooling and a Normalize module, read from the folder."""
    import json
    import shutil

    from transformers import LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(tiny_embed_dir).model.save_pretrained(tmp_path, safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    # untied: the pooling runner holds no head, so its absence from the checkpoint is fine
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"],
                                                      "tie_word_embeddings": False}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_embed_dir}/{name}", tmp_path / name)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (kind, path) in enumerate([("Transformer", ""), ("Pooling", "1_Pooling"), ("Normalize", "2_Normalize")])]))
    llm = make_pooling_llm(str(tmp_path))
    for vector, hidden in zip(embed(llm, PROMPTS[:3]), reference):
        assert torch.allclose(torch.tensor(vector), F.normalize(hidden.mean(dim=0), dim=-1), atol=1e-5)


def test_preempted_pooling_requests_start_afresh(tiny_embed_dir, reference):
    """Four prompts advance 8 tokens a step in 64 tokens of KV: running requests are preempted mid-prompt and
    recompute from their start; the means stay exact."""
    llm = make_pooling_llm(tiny_embed_dir, pooler_config={"pooling_type": "MEAN"}, num_gpu_blocks_override=16,
                           max_model_len=64, max_num_batched_tokens=32, long_prefill_token_threshold=8)
    for vector, hidden in zip(embed(llm, PROMPTS), reference):
        assert cosine(vector, hidden.mean(dim=0)) >= 0.9999
    assert llm.llm_engine.stats.num_preemptions > 0
    assert llm.llm_engine.kv_cache.num_used_blocks == 0  # every pooling request's KV is freed when it ends
