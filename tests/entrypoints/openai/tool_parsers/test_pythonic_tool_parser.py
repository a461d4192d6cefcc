"""The pythonic parser (Llama 3.2/4 style ``[f(a=1), g(b="x")]``): recorded, malformed, streamed."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser

TWO_CALLS = '[get_weather(city="San Francisco", metric=True), get_time(zone=\'PST\', offsets=[-8, 1.5])]'
NESTED = '[book(trip={"from": "SFO", "to": "CDG", "legs": [1, 2]}, note="say \\"hi\\"\\n", seats=None)]'
DOTTED = "[maps.route(origin='a', destination='b')]"


def test_two_calls():
    calls = PythonicToolParser().extract(TWO_CALLS).calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "San Francisco", "metric": True}),
        ("get_time", {"zone": "PST", "offsets": [-8, 1.5]})]


def test_nested_literals_and_dotted_names():
    call = PythonicToolParser().extract(NESTED).calls[0]
    assert call.arguments == {"trip": {"from": "SFO", "to": "CDG", "legs": [1, 2]}, "note": 'say "hi"\n',
                              "seats": None}
    assert PythonicToolParser().extract(DOTTED).calls[0].name == "maps.route"


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    "[1, 2, 3]",  # a list, but not of calls
    "[get_weather('Paris')]",  # positional arguments
    "[get_weather(city=lookup())]",  # not a literal
    '[get_weather(city="Paris"',  # cut short
])
def test_text_without_whole_calls_is_all_content(text):
    parsed = PythonicToolParser().extract(text)
    assert parsed.content == text and parsed.calls == []


@pytest.mark.parametrize("text", [TWO_CALLS, NESTED, DOTTED, "The weather is fine.", "[1, 2, 3]",
                                  '[f(x=12345, y=-0.25, z="a,b)c")]'])
def test_streaming_adds_up_to_the_whole_reply(check_stream_matches, text):
    check_stream_matches(PythonicToolParser(), text)


def test_a_number_still_arriving_is_not_shown():
    call = PythonicToolParser().parse("[f(a='x', n=12", final=False).calls[0]
    assert call.name == "f" and call.arguments == {"a": "x"} and not call.complete
