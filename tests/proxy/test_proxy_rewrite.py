"""The bodies the proxy sends to the prefill and decode instances."""
import pytest

from folovllm.proxy.rewrite import check_body, decode_body, prefill_body


def test_prefill_body_asks_one_unstreamed_token_and_a_remote_decode():
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "stream": True,
            "stream_options": {"include_usage": True}, "min_tokens": 5, "temperature": 0.0}
    prefill = prefill_body(body, "completions")
    assert prefill == {"model": "m", "prompt": "hi", "max_tokens": 1, "stream": False, "temperature": 0.0,
                       "kv_transfer_params": {"do_remote_decode": True}}
    assert body["max_tokens"] == 50 and body["stream_options"] == {"include_usage": True}  # not mutated


def test_chat_prefill_caps_max_completion_tokens_too():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    prefill = prefill_body(body, "chat")
    assert prefill["max_tokens"] == 1 and prefill["max_completion_tokens"] == 1 and prefill["stream"] is False
    prefill["messages"][0]["content"] = "changed"
    assert body["messages"][0]["content"] == "hi"


def test_a_client_kv_transfer_params_does_not_reach_either_instance():
    body = {"prompt": "hi", "kv_transfer_params": {"client": "sent"}}
    assert prefill_body(body, "completions")["kv_transfer_params"] == {"do_remote_decode": True}
    assert "kv_transfer_params" not in decode_body(body, None)


def test_decode_body_is_the_clients_plus_the_producers_params_as_they_came():
    body = {"prompt": [1, 2, 3], "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    params = {"remote_block_ids": [4, 2], "remote_engine_id": "p0", "anything": {"nested": True}}
    assert decode_body(body, params) == {**body, "kv_transfer_params": params}
    assert decode_body(body, None) == body


@pytest.mark.parametrize("n", [2, 0, "3"])
def test_n_other_than_one_is_refused_with_the_reason(n):
    with pytest.raises(ValueError, match="n must be 1 through the prefill/decode proxy"):
        check_body({"prompt": "hi", "n": n})


def test_n_one_or_absent_passes_and_a_non_object_does_not():
    assert check_body({"prompt": "hi", "n": 1}) == {"prompt": "hi", "n": 1}
    assert check_body({"prompt": "hi"})
    with pytest.raises(ValueError, match="JSON object"):
        check_body([1, 2])
