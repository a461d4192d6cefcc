"""bench serve datasets: lengths, seed workloads, ShareGPT-like statistics, shared prefix, JSONL errors."""
import json
import re

import numpy as np
import pytest

from folovllm.bench import datasets as ds


def maker(fmt="ids", seed=0):
    return ds.PromptMaker(fmt, np.random.default_rng(seed))


def test_random_fixed_and_ranged_lengths_are_exact_for_token_ids():
    reqs = ds.random_dataset(50, (7, 7), (3, 3), maker())
    assert all(len(r.prompt) == 7 == r.prompt_len and r.max_tokens == 3 and r.ignore_eos for r in reqs)
    lo, hi = ds.DEFAULT_TOKEN_ID_RANGE
    assert all(lo <= t < hi for r in reqs for t in r.prompt)
    ranged = ds.random_dataset(400, (5, 9), (1, 4), maker())
    assert {len(r.prompt) for r in ranged} == set(range(5, 10))
    assert {r.max_tokens for r in ranged} == set(range(1, 5))


def test_text_prompts_are_words_and_same_seed_same_requests():
    reqs = ds.random_dataset(5, (12, 12), (4, 4), maker("text"))
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 12 for r in reqs)
    assert reqs == ds.random_dataset(5, (12, 12), (4, 4), maker("text"))
    assert reqs != ds.random_dataset(5, (12, 12), (4, 4), maker("text", seed=1))


def test_parse_len_range():
    assert ds.parse_len_range("3:9", "--x") == (3, 9) and ds.parse_len_range("5", "--x") == (5, 5)
    for bad in ("9:3", "0:4", "a:b"):
        with pytest.raises(ValueError, match="--x"):
            ds.parse_len_range(bad, "--x")


def test_seed_workloads_follow_the_table_and_scale_with_num_prompts():
    warm = ds.seed_workload("warm-up", None, maker())
    assert len(warm) == 8 and {(r.prompt_len, r.max_tokens) for r in warm} == {(11, 8)}
    heavy = ds.seed_workload("prefill-heavy", 4, maker(), output_len=(2, 2))
    assert len(heavy) == 4 and {(r.prompt_len, r.max_tokens) for r in heavy} == {(1024, 2)}
    assert ds.default_request_rate("long-poisson") == 64.0 and ds.default_request_rate("l2") == float("inf")
    assert ds.default_request_rate("random") == float("inf")


def test_mixed_is_half_long_with_class_tags():
    reqs = ds.seed_workload("mixed", 200, maker())
    long = [r for r in reqs if r.tag == "long"]
    assert len(long) == 100 and all(r.prompt_len == 1024 for r in long)
    assert all(r.prompt_len == 10 for r in reqs if r.tag == "short")
    assert [r.tag for r in reqs[:20]] != sorted(r.tag for r in reqs[:20])  # shuffled, not blocks
    scaled = ds.seed_workload("mixed", 8, maker(), input_len=(64, 64))
    assert {r.prompt_len for r in scaled if r.tag == "long"} == {64}


def test_sharegpt_like_length_statistics():
    reqs = ds.sharegpt_like_dataset(5000, maker())
    ins = np.array([r.prompt_len for r in reqs])
    outs = np.array([r.max_tokens for r in reqs])
    assert ins.mean() == pytest.approx(200, rel=0.05) and ins.max() <= 2048 and ins.min() >= 1
    assert outs.mean() == pytest.approx(150, rel=0.05) and outs.max() <= 1024 and outs.min() >= 1
    assert all(len(r.prompt) == r.prompt_len for r in reqs[:50])
    fitted = ds.sharegpt_like_dataset(2000, maker(), max_model_len=512)
    assert all(r.prompt_len + r.max_tokens <= 512 and r.max_tokens >= 1 for r in fitted)


def test_shared_prefix_requests_share_exactly_the_prefix():
    reqs = ds.shared_prefix_dataset(6, 32, (8, 8), (4, 4), maker())
    prefix = reqs[0].prompt[:32]
    assert all(r.prompt[:32] == prefix and r.prompt_len == len(r.prompt) == 40 for r in reqs)
    assert len({tuple(r.prompt[32:]) for r in reqs}) == 6
    text = ds.shared_prefix_dataset(3, 5, (4, 4), (4, 4), maker("text"))
    assert len({" ".join(r.prompt.split()[:5]) for r in text}) == 1


def test_adapt_to_endpoint():
    chat = ds.adapt_to_endpoint([ds.ServeRequest("hello there", 4, 2)], "chat")[0]
    assert chat.messages == [{"role": "user", "content": "hello there"}] and chat.prompt is None
    with pytest.raises(ValueError, match="--endpoint completions"):
        ds.adapt_to_endpoint([ds.ServeRequest([1, 2], 4, 2)], "chat")
    with pytest.raises(ValueError, match="request 2 .*--endpoint chat"):
        ds.adapt_to_endpoint([ds.ServeRequest([1], 4, 1), ds.ServeRequest(None, 4, 1, messages=[])], "completions")


def write_lines(tmp_path, lines):
    path = tmp_path / "reqs.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_jsonl_loads_prompts_messages_arrivals_and_classes(tmp_path):
    path = write_lines(tmp_path, [
        {"prompt": "a b c", "max_tokens": 4, "arrival_s": 0.5, "class": "x"},
        "",
        {"prompt": [1, 2], "max_tokens": 2, "arrival_s": 0, "ignore_eos": True},
        {"messages": [{"role": "user", "content": "hi you"}], "max_tokens": 1, "arrival_s": 1.5}])
    reqs = ds.load_jsonl(path)
    assert [r.prompt_len for r in reqs] == [3, 2, 2] and [r.arrival_s for r in reqs] == [0.5, 0.0, 1.5]
    assert reqs[0].tag == "x" and not reqs[0].ignore_eos and reqs[1].ignore_eos
    assert len(ds.load_jsonl(path, num_prompts=2)) == 2


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"max_tokens": 3}, "exactly one of 'prompt' or 'messages'"),
    ({"prompt": "x", "messages": [], "max_tokens": 3}, "exactly one of"),
    ({"prompt": "", "max_tokens": 3}, "'prompt' must be"),
    ({"prompt": [1, -2], "max_tokens": 3}, "'prompt' must be"),
    ({"messages": [{"role": "user"}], "max_tokens": 3}, "'messages' must be"),
    ({"prompt": "x"}, "'max_tokens' must be an integer >= 1, got None"),
    ({"prompt": "x", "max_tokens": 0}, "'max_tokens' must be"),
    ({"prompt": "x", "max_tokens": True}, "'max_tokens' must be"),
    ({"prompt": "x", "max_tokens": 2, "arrival_s": -1}, "'arrival_s' must be"),
    ({"prompt": "x", "max_tokens": 2, "class": 3}, "'class' must be a string"),
])
def test_jsonl_bad_line_names_line_number_and_problem(tmp_path, bad, message):
    path = write_lines(tmp_path, [{"prompt": "fine", "max_tokens": 2}, "", bad])
    with pytest.raises(ValueError, match=f"reqs.jsonl:3: .*{re.escape(message)}"):
        ds.load_jsonl(path)


def test_jsonl_arrivals_on_every_line_or_none_and_empty_file(tmp_path):
    path = write_lines(tmp_path, [{"prompt": "a", "max_tokens": 2, "arrival_s": 0.1},
                                  {"prompt": "b", "max_tokens": 2}])
    with pytest.raises(ValueError, match=r":2: 'arrival_s' must be given on every line or on none"):
        ds.load_jsonl(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no requests"):
        ds.load_jsonl(empty)
