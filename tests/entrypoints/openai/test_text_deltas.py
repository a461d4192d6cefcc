"""Streaming cursors: the text sent so far never holds part of a stop string that matches later."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from folovllm.detokenizer import find_stop
from folovllm.entrypoints.openai.serving import TextDeltas
from folovllm.outputs import CompletionOutput


def _output(text: str, finished: bool = False) -> CompletionOutput:
    return CompletionOutput(0, text, list(range(len(text))), finish_reason="stop" if finished else None)


@given(text=st.text(alphabet="abc", max_size=10), stop=st.lists(st.text(alphabet="abc", min_size=1, max_size=4),
                                                                 min_size=1, max_size=3),
       more=st.text(alphabet="abc", max_size=4))
def test_held_back_text_never_leaks_part_of_a_stop_string(text: str, stop: list[str], more: str) -> None:
    if find_stop(text, len(text), stop) is not None:
        return  # the engine would already have stopped on an earlier step
    cursor = TextDeltas(stop)
    sent = cursor.advance(_output(text))[0]
    full = text + more
    cut = find_stop(full, len(more), stop)
    if cut is not None:
        assert len(sent) <= cut  # what was sent stays in the final text
        assert full[:cut].startswith(sent)


def test_everything_is_sent_once_the_request_ends() -> None:
    cursor = TextDeltas(["STOP"])
    assert cursor.advance(_output("Hello wor")) == ("Hello ", 0)
    assert cursor.advance(_output("Hello world")) == ("wo", 9)
    assert cursor.advance(_output("Hello world!", finished=True)) == ("rld!", 11)


def test_without_stop_strings_nothing_is_held() -> None:
    cursor = TextDeltas([])
    assert cursor.advance(_output("abc"))[0] == "abc"


def test_the_cost_does_not_depend_on_the_stop_strings() -> None:
    cursor = TextDeltas(["x" * 1000] * 64)
    assert cursor.holdback == 999
    assert cursor.advance(_output("y" * 1500))[0] == "y" * 501
