"""The worker's pooler over chunks, the pooling config (flags, sentence-transformers folders), the pairing
of score, and which parameters an engine takes."""
import json

import pytest
import torch
import torch.nn.functional as F

from folovllm import PoolingParams, SamplingParams
from folovllm.config import EngineConfig
from folovllm.engine.pooling import pooling_request
from folovllm.pooling import (
    Pooler,
    PoolerConfig,
    PoolingChunk,
    PoolingRow,
    pooler_config_for,
)
from folovllm.pooling.score import cosine_scores, pair_up


def pool_in_chunks(kind: str, rows: torch.Tensor, sizes: list[int], normalize: bool = False) -> torch.Tensor:
    """Pools ``rows`` of one request fed as chunks of ``sizes``, each in a step beside another request's rows."""
    pooler, row, start, result = Pooler(), PoolingRow(kind, normalize), 0, None
    for size in sizes:
        other = torch.randn(3, rows.shape[1])
        hidden = torch.cat([other, rows[start:start + size]])
        chunks = [PoolingChunk("other", 0, 3, 0, PoolingRow("LAST", False), True),
                  PoolingChunk("r", 3, size, start, row, start + size == len(rows))]
        out = dict(pooler.pool(hidden, chunks))
        assert torch.equal(out["other"], other[-1])
        start += size
        result = out.get("r")
    assert not pooler._partial  # nothing kept once the request is done
    return result


@pytest.mark.parametrize("sizes", [[7], [3, 4], [1, 1, 5]])
def test_every_pooling_type_over_chunks(sizes):
    rows = torch.randn(7, 5)
    assert torch.allclose(pool_in_chunks("LAST", rows, sizes), rows[-1])
    assert torch.allclose(pool_in_chunks("MEAN", rows, sizes), rows.mean(dim=0), atol=1e-6)
    assert torch.allclose(pool_in_chunks("CLS", rows, sizes), rows[0])
    assert torch.allclose(pool_in_chunks("ALL", rows, sizes), rows)
    assert torch.allclose(pool_in_chunks("ALL", rows, sizes, normalize=True), F.normalize(rows, dim=-1))


def test_a_request_recomputed_from_position_zero_starts_afresh():
    pooler, row, rows = Pooler(), PoolingRow("MEAN", False), torch.randn(4, 2)
    pooler.pool(rows[:2] + 100, [PoolingChunk("r", 0, 2, 0, row, False)])  # then preempted
    pooler.pool(rows[:2], [PoolingChunk("r", 0, 2, 0, row, False)])
    (_, mean), = pooler.pool(rows[2:], [PoolingChunk("r", 0, 2, 2, row, True)])
    assert torch.allclose(mean, rows.mean(dim=0))


def test_pooler_config_from_flag_and_sentence_transformers_folder(tmp_path):
    assert pooler_config_for(None, str(tmp_path)) == PoolerConfig("LAST", True)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}))
    assert pooler_config_for(None, str(tmp_path)) == PoolerConfig("MEAN", False)  # no Normalize module
    assert pooler_config_for({"pooling_type": "cls"}, str(tmp_path)) == PoolerConfig("CLS", False)
    with pytest.raises(ValueError, match="softmax"):
        pooler_config_for({"softmax": True}, str(tmp_path))
    with pytest.raises(ValueError, match="pooling_type"):
        pooler_config_for({"pooling_type": "MAX"}, str(tmp_path))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="not implemented"):
        pooler_config_for(None, str(tmp_path))


def test_runner_and_convert_flags():
    assert EngineConfig(convert="embed").resolve().runner == "pooling"
    assert EngineConfig(runner="pooling").resolve().convert == "embed"
    assert EngineConfig().resolve().runner == "generate"
    for bad in (dict(runner="generate", convert="embed"), dict(runner="pooling", convert="none"),
                dict(pooler_config={"pooling_type": "MEAN"}), dict(runner="embed")):
        with pytest.raises(ValueError):
            EngineConfig(**bad)


def test_parameters_must_fit_the_engine():
    pooler = PoolerConfig("LAST", True)
    with pytest.raises(ValueError, match="does not generate"):
        pooling_request(SamplingParams(), pooler, 64)
    with pytest.raises(ValueError, match="runner='pooling'"):
        pooling_request(PoolingParams(), None, 64)
    with pytest.raises(ValueError, match="hidden size"):
        pooling_request(PoolingParams(dimensions=65), pooler, 64)
    with pytest.raises(ValueError, match="encode"):
        pooling_request(PoolingParams(), PoolerConfig("ALL", True), 64)
    row, params = pooling_request(PoolingParams(dimensions=8, normalize=False), pooler, 64)
    assert row == PoolingRow("LAST", False, 8) and params.max_tokens == 1
    for bad in (dict(dimensions=0), dict(normalize="yes"), dict(task="classify"), dict(truncate_prompt_tokens=0)):
        with pytest.raises(ValueError):
            PoolingParams(**bad)


def test_score_pairs_as_vllm_does():
    assert pair_up("q", ["a", "b"], str) == (["q", "q"], ["a", "b"])
    assert pair_up(["x", "y"], ["a", "b"], str) == (["x", "y"], ["a", "b"])
    assert pair_up("x", "a", str) == (["x"], ["a"])
    with pytest.raises(ValueError):
        pair_up(["x", "y"], ["a", "b", "c"], str)
    with pytest.raises(ValueError):
        pair_up([], "a", str)
    assert cosine_scores([[1.0, 0.0], [1.0, 1.0]], [[2.0, 0.0], [-1.0, -1.0]]) == pytest.approx([1.0, -1.0])
