"""`folovllm bench embed` end to end on a tiny model: both sides run, embed the same vectors, and write the JSON."""
import json

import pytest

from folovllm.entrypoints.cli import main
from tests.pooling.conftest import tiny_embed_dir  # noqa: F401 (the fixture)


@pytest.mark.slow
def test_bench_embed_writes_both_sides(tiny_embed_dir, tmp_path):  # noqa: F811
    out = tmp_path / "embed.json"
    assert main(["bench", "embed", tiny_embed_dir, "--num-inputs", "6", "--input-len", "12", "--dtype", "float32",
                 "--hf-batch-size", "4", "--pooling-type", "MEAN", "--max-num-batched-tokens", "32",
                 "--output-json", str(out)]) == 0
    ours, theirs = json.loads(out.read_text())
    assert (ours["engine"], theirs["engine"]) == ("folovllm", "hf-batched-forward")
    assert ours["num_requests"] == theirs["num_requests"] == 6 and ours["input_tokens"] == 72
    assert ours["inputs_per_s"] > 0 and theirs["inputs_per_s"] > 0
    assert ours["extra"]["min_cosine_vs_hf"] > 0.9999


@pytest.mark.slow
def test_bench_embed_rounds_take_turns(tiny_embed_dir, tmp_path, capsys):  # noqa: F811
    """With --rounds both sides stay loaded and run N times each; each figure is the median round."""
    out = tmp_path / "embed.json"
    assert main(["bench", "embed", tiny_embed_dir, "--num-inputs", "6", "--input-len", "40", "--dtype", "float32",
                 "--hf-batch-size", "4", "--rounds", "3", "--max-num-batched-tokens", "64",
                 "--output-json", str(out)]) == 0
    ours, theirs = json.loads(out.read_text())
    for side in (ours, theirs):
        rounds = side["extra"]["round_seconds"]
        assert len(rounds) == 3 and all(r > 0 for r in rounds) and side["config"]["rounds"] == 3
        assert side["inputs_per_s"] == pytest.approx(6 / sorted(rounds)[1])
    assert ours["extra"]["min_cosine_vs_hf"] > 0.9999
    assert ours["extra"]["prefix_cache_hit_tokens"] == 0  # no round reads blocks an earlier one left behind
    assert main(["bench", "embed", tiny_embed_dir, "--num-inputs", "2", "--input-len", "4", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
