"""Incremental detokenization (real SmolLM2 tokenizer) and stop-string matching."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from folovllm.detokenizer import IncrementalDetokenizer, find_stop

PROMPT = "<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n"
fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)


def stream(tokenizer, output_ids: list[int], prompt_ids: list[int] | None = None, skip: bool = True):
    """Feed ids one at a time; return (deltas from append, delta from finish, detokenizer)."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids or [], skip_special_tokens=skip)
    deltas = [detok.append(token_id) for token_id in output_ids]
    return deltas, detok.finish(), detok


@pytest.mark.parametrize(
    "text",
    [
        "你好，世界！今天天气很好。",
        "Emoji: 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done",
        "Mixed 中文 and English, ünïcödé, Ελληνικά, русский 🚀 text.",
        "def f(x):\n    return x  +  1\n\n\n\tindented\t tabs   and  spaces  \n",
        "  leading spaces and trailing ones   ",
    ],
)
def test_stream_matches_full_decode(smol_tokenizer, text: str) -> None:
    ids = smol_tokenizer.encode(text)
    prompt_ids = smol_tokenizer.encode(PROMPT)
    deltas, tail, detok = stream(smol_tokenizer, ids, prompt_ids)
    assert "".join(deltas) + tail == text == detok.text
    assert tail == ""  # valid text completes on its last token: nothing left to flush
    assert all("\ufffd" not in d for d in deltas)


def test_multibyte_character_held_back_until_complete(smol_tokenizer) -> None:
    ids = smol_tokenizer.encode("😀")
    assert len(ids) > 1  # the emoji's bytes are split across tokens
    deltas, _, _ = stream(smol_tokenizer, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "😀"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(smol_tokenizer, skip: bool) -> None:
    ids = smol_tokenizer.encode("Hello<|im_end|>\n<|im_start|>world 你好<|endoftext|>")
    deltas, tail, detok = stream(smol_tokenizer, ids, skip=skip)
    expected = smol_tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) + tail == expected == detok.text
    assert ("<|im_end|>" in expected) is not skip


class CountingTokenizer:
    """Passes everything through to a tokenizer, counting calls of its whole-sequence ``decode``."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self.decode_calls = tokenizer, 0

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def decode(self, *args, **kwargs) -> str:
        self.decode_calls += 1
        return self._tokenizer.decode(*args, **kwargs)


def test_window_stays_small(smol_tokenizer) -> None:
    ids = smol_tokenizer.encode("word " * 500)
    counting = CountingTokenizer(smol_tokenizer)
    detok = IncrementalDetokenizer(counting, [])
    for token_id in ids:
        detok.append(token_id)
        assert len(detok._held) <= 4  # holds a few recent tokens, not the whole output
    assert counting.decode_calls == 0  # the stream decodes a window per token, never the output so far
    assert detok.text == "word " * 500


@fixture_ok
@given(text=st.text(max_size=60))
def test_random_text_roundtrip(smol_tokenizer, text: str) -> None:
    ids = smol_tokenizer.encode(text)
    deltas, tail, _ = stream(smol_tokenizer, ids, smol_tokenizer.encode("Hi there"))
    assert "".join(deltas) + tail == smol_tokenizer.decode(ids)


@fixture_ok
@given(data=st.data())
def test_random_token_ids_match_decode_after_finish(smol_tokenizer, data: st.DataObject) -> None:
    vocab = len(smol_tokenizer)
    ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), max_size=8))
    skip = data.draw(st.booleans())
    deltas, tail, detok = stream(smol_tokenizer, ids, prompt, skip)
    expected = smol_tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) + tail == expected == detok.text


def byte_token_ids(tokenizer) -> dict[int, int]:
    """Token id of each single-byte token of a byte-level BPE vocab (GPT-2's byte→char map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    ids = {b: tokenizer.convert_tokens_to_ids(c) for b, c in chars.items()}
    return {b: i for b, i in ids.items() if i != tokenizer.unk_token_id}


@fixture_ok
@given(data=st.data())
def test_split_and_invalid_utf8_match_decode_after_finish(smol_tokenizer, data: st.DataObject) -> None:
    """Single-byte tokens: characters split across tokens, invalid and truncated sequences."""
    byte_ids = byte_token_ids(smol_tokenizer)
    high = [b for b in byte_ids if b >= 0x80]
    ascii_ = [b for b in byte_ids if b < 0x80]
    raw = data.draw(st.lists(st.sampled_from(high + ascii_[:8]), max_size=24))
    ids = [byte_ids[b] for b in raw]
    deltas, tail, detok = stream(smol_tokenizer, ids)
    assert "".join(deltas) + tail == smol_tokenizer.decode(ids) == detok.text


def test_finish_flushes_truncated_character(smol_tokenizer) -> None:
    byte_ids = byte_token_ids(smol_tokenizer)
    ids = [byte_ids[b] for b in "a你".encode()[:-1]]  # "a" + the first two bytes of "你"
    deltas, tail, detok = stream(smol_tokenizer, ids)
    assert "".join(deltas) == "a"
    assert tail == smol_tokenizer.decode(ids)[1:] and tail.endswith("\ufffd")
    assert detok.text == smol_tokenizer.decode(ids)


def test_prompt_ending_mid_character_is_not_glued_to_output(smol_tokenizer) -> None:
    emoji_ids = smol_tokenizer.encode("😀")
    out_ids = smol_tokenizer.encode(" ok")
    deltas, tail, _ = stream(smol_tokenizer, out_ids, prompt_ids=emoji_ids[:1])
    assert "".join(deltas) + tail == " ok"


def test_find_stop_in_new_text() -> None:
    assert find_stop("Hello world", 5, ["wor"]) == 6
    assert find_stop("Hello world", 5, ["wor"], include_stop_str=True) == 9
    assert find_stop("Hello world", 5, ["xyz"]) is None
    assert find_stop("", 0, ["a"]) is None


def test_find_stop_spanning_two_deltas() -> None:
    text = "The answer is 42.\nEND"
    # Previous delta ended with "\nE", this one added "ND": the stop string spans both.
    assert find_stop(text, 2, ["\nEND"]) == len("The answer is 42.")


def test_find_stop_ignores_old_text() -> None:
    # "stop" lies entirely in text checked on an earlier step.
    assert find_stop("stop here and more", 4, ["stop"]) is None


def test_find_stop_takes_earliest_match() -> None:
    text = "abc STOP xyz END"
    assert find_stop(text, len(text), ["END", "STOP"]) == 4
    assert find_stop(text, len(text), ["END", "STOP"], include_stop_str=True) == 8
