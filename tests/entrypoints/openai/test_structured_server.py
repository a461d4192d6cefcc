"""Structured outputs through the live server with the official openai client: response_format
(pydantic models via ``parse``, json_object), vLLM's structured_outputs and guided_* fields, a bad
constraint as a 400 that leaves other requests alone, n > 1, streaming."""
from __future__ import annotations

import json
import re
import threading

import httpx
import openai
import pytest
from pydantic import BaseModel

MODEL = "smol"


def chat(client, content: str, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          **{"temperature": 0.0, "max_tokens": 64, **kwargs})


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    address: Address


def test_parse_returns_the_pydantic_object(client) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person (name, age, address) in JSON."}],
        response_format=Person, temperature=0.0, max_tokens=200)
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)


def test_json_object_loads(client) -> None:
    answer = chat(client, "Give a JSON object with keys name and age for a person.", max_tokens=120,
                  response_format={"type": "json_object"}).choices[0]
    assert answer.finish_reason == "stop"
    assert isinstance(json.loads(answer.message.content), dict)


@pytest.mark.parametrize("extra, pattern", [
    ({"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}}, r"[0-9]{3}-[0-9]{4}"),
    ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, r"red|green|blue"),
    ({"structured_outputs": {"grammar": 'root ::= "The answer is " ("yes" | "no") "."'}},
     r"The answer is (yes|no)\."),
    ({"guided_regex": r"[A-Z][a-z]{1,8}"}, r"[A-Z][a-z]{1,8}"),
    ({"guided_choice": ["Paris", "London"]}, r"Paris|London"),
    ({"guided_grammar": 'root ::= [0-9] [0-9]? " apples"', "guided_decoding_backend": "xgrammar"},
     r"[0-9][0-9]? apples"),
])
def test_regex_choice_grammar_on_both_endpoints(client, extra, pattern) -> None:
    text = chat(client, "What is the capital of France?", extra_body=extra).choices[0].message.content
    assert re.fullmatch(pattern, text), text
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=32,
                                           temperature=0.0, extra_body=extra).choices[0]
    assert re.fullmatch(pattern, completion.text) and completion.finish_reason == "stop", completion.text


def test_guided_json(client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"]}
    text = chat(client, "Name a city in JSON.", max_tokens=100,
                extra_body={"guided_json": schema}).choices[0].message.content
    assert isinstance(json.loads(text)["city"], str)


def test_constrained_greedy_equals_unconstrained_when_it_obeys(client) -> None:
    question = "What is the capital of France? Answer in one word."
    free = chat(client, question, max_tokens=6).choices[0].message.content
    guided = chat(client, question, max_tokens=12,
                  extra_body={"structured_outputs": {"choice": [free, "zzz"]}}).choices[0]
    assert guided.message.content == free and guided.finish_reason == "stop"


def test_n_samples_all_obey(client) -> None:
    answer = chat(client, "Pick a number.", n=3, temperature=1.0, seed=3,
                  extra_body={"guided_regex": r"[1-9][0-9]?"})
    assert len(answer.choices) == 3
    assert all(re.fullmatch(r"[1-9][0-9]?", c.message.content) for c in answer.choices)


def test_streamed_constrained_output(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Yes or no?"}], stream=True, temperature=0.0,
        max_tokens=16, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text in ("yes", "no", "maybe")


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs"),
])
def test_a_bad_constraint_is_a_400_and_a_concurrent_request_is_unaffected(client, http, fields, param) -> None:
    result: dict = {}

    def good() -> None:
        result["text"] = chat(client, "Say hi.", max_tokens=24, extra_body={"guided_choice": ["hi", "hello"]}
                              ).choices[0].message.content

    thread = threading.Thread(target=good)
    thread.start()
    response = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 4, **fields})
    thread.join(120)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "invalid" in error["message"] and param in error["message"]
    assert result["text"] in ("hi", "hello")
    with pytest.raises(openai.BadRequestError):
        chat(client, "Hi", max_tokens=4, extra_body=fields)


def test_server_stays_healthy(server) -> None:
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
