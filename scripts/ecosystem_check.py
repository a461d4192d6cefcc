"""Runs the clients agent frameworks and evaluators use against a live FoloVLLM server; pass/fail each.

Needs the client libraries in their own virtualenv (`make ecosystem`), never in CI:

    .venv-eco/bin/python scripts/ecosystem_check.py                 # starts a server on a free port
    .venv-eco/bin/python scripts/ecosystem_check.py --base-url http://127.0.0.1:8000
    .venv-eco/bin/python scripts/ecosystem_check.py --write-docs    # also rewrites docs/ecosystem.md

Checks: lm-eval `local-completions` on a small loglikelihood (multiple-choice) task and
`local-chat-completions` on a generation task, both from local files; instructor in JSON_SCHEMA and
TOOLS modes; langchain-openai `with_structured_output` (json_schema and function_calling) and
`bind_tools`; the openai client's `chat.completions.parse`. A check passes when the client gets a
well-formed result; the model's answers (a 135M model) are reported, not judged.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MAIN_PYTHON = ROOT / ".venv" / "bin" / "python"
SERVER_FLAGS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]

MULTIPLE_CHOICE = [
    {"question": "The capital of France is", "choices": ["Paris", "Berlin", "Madrid", "Rome"], "answer": 0},
    {"question": "The capital of Germany is", "choices": ["Vienna", "Berlin", "Prague", "Bern"], "answer": 1},
    {"question": "Two plus two equals", "choices": ["three", "five", "four", "six"], "answer": 2},
    {"question": "The sun rises in the", "choices": ["west", "north", "south", "east"], "answer": 3},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Kelvin", "Rankine", "Newton"],
     "answer": 0},
    {"question": "A week has seven", "choices": ["months", "days", "years", "hours"], "answer": 1},
    {"question": "Cats are a kind of", "choices": ["fish", "bird", "mammal", "insect"], "answer": 2},
    {"question": "The opposite of hot is", "choices": ["warm", "loud", "heavy", "cold"], "answer": 3},
]
GENERATION = [
    {"question": "What is the capital of France? Answer with one word.", "answer": "Paris"},
    {"question": "What is 2 + 3? Answer with a number only.", "answer": "5"},
    {"question": "What color is the sky on a clear day? Answer with one word.", "answer": "Blue"},
    {"question": "How many legs does a spider have? Answer with a number only.", "answer": "8"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    cmd = [str(MAIN_PYTHON), "-m", "folovllm.entrypoints.cli", "serve", "--port", str(port), *SERVER_FLAGS]
    print("starting:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("the server did not become ready in 180 s")


def export_tokenizer(out: Path) -> None:
    """The served model's tokenizer as a HF folder: lm-eval counts context tokens with it."""
    code = ("import sys; from folovllm.model.loader import default_model_path; "
            "from folovllm.model.loader.tokenizer import load_tokenizer; "
            "load_tokenizer(default_model_path()).save_pretrained(sys.argv[1])")
    subprocess.run([str(MAIN_PYTHON), "-c", code, str(out)], cwd=ROOT, check=True)


def write_lm_eval_tasks(folder: Path) -> None:
    mc = folder / "mc.jsonl"
    mc.write_text("".join(json.dumps(d) + "\n" for d in MULTIPLE_CHOICE))
    gen = folder / "gen.jsonl"
    gen.write_text("".join(json.dumps(d) + "\n" for d in GENERATION))
    (folder / "folo_mc.yaml").write_text(f"""task: folo_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {mc}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
""")
    (folder / "folo_gen.yaml").write_text(f"""task: folo_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {gen}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""")


def check_lm_eval_loglikelihood(base: str, model: str, work: Path) -> str:
    import lm_eval
    from lm_eval.tasks import TaskManager

    tokenizer = work / "tokenizer"
    export_tokenizer(tokenizer)
    result = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": model, "base_url": f"{base}/v1/completions", "tokenizer": str(tokenizer),
                    "tokenizer_backend": "huggingface", "num_concurrent": 4, "max_retries": 1},
        tasks=["folo_mc"], task_manager=TaskManager(include_path=str(work)))
    acc = result["results"]["folo_mc"]["acc,none"]
    return f"acc {acc:.3f} on {len(MULTIPLE_CHOICE)} items (chance 0.25)"


def check_lm_eval_generation(base: str, model: str, work: Path) -> str:
    import lm_eval
    from lm_eval.tasks import TaskManager

    result = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={"model": model, "base_url": f"{base}/v1/chat/completions", "max_retries": 1},
        tasks=["folo_gen"], task_manager=TaskManager(include_path=str(work)), apply_chat_template=True)
    score = result["results"]["folo_gen"]["exact_match,none"]
    return f"exact_match {score:.3f} on {len(GENERATION)} items"


def _models():
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        country: str

    class Person(BaseModel):
        name: str
        age: int
        address: Address

    return Person


def check_openai_parse(base: str, model: str) -> str:
    from openai import OpenAI

    person = _models()
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    completion = client.chat.completions.parse(
        model=model, response_format=person, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Describe Marie, 34, who lives in Lyon, France, as JSON."}])
    parsed = completion.choices[0].message.parsed
    if not isinstance(parsed, person):
        raise AssertionError(f"parsed is {parsed!r}")
    return parsed.model_dump_json()


def check_instructor(base: str, model: str, mode_name: str) -> str:
    import instructor
    from openai import OpenAI

    person = _models()
    client = instructor.from_openai(OpenAI(base_url=f"{base}/v1", api_key="none"),
                                    mode=getattr(instructor.Mode, mode_name))
    result = client.chat.completions.create(
        model=model, response_model=person, max_retries=0, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Marie is 34 and lives in Lyon, France."}])
    return result.model_dump_json()


def check_langchain_structured(base: str, model: str, method: str) -> str:
    from langchain_openai import ChatOpenAI

    person = _models()
    llm = ChatOpenAI(model=model, base_url=f"{base}/v1", api_key="none", temperature=0, max_tokens=200)
    result = llm.with_structured_output(person, method=method).invoke(
        "Marie is 34 and lives in Lyon, France.")
    if not isinstance(result, person):
        raise AssertionError(f"got {result!r}")
    return result.model_dump_json()


def check_openai_tool_round_trip(base: str, model: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="required",
                                           max_tokens=100, temperature=0)
    calls = first.choices[0].message.tool_calls
    if not calls:
        raise AssertionError(f"no tool call in {first!r}")
    messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]})
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"})
    second = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="none",
                                            max_tokens=40, temperature=0)
    answer = second.choices[0].message.content
    if not isinstance(answer, str) or not answer:
        raise AssertionError(f"no answer after the tool's reply: {second!r}")
    return f"{calls[0].function.name}({calls[0].function.arguments}) -> {answer[:60]!r}"


def check_langchain_tools(base: str, model: str, tool_choice: str = "get_weather") -> str:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(model=model, base_url=f"{base}/v1", api_key="none", temperature=0, max_tokens=100)
    message = llm.bind_tools([get_weather], tool_choice=tool_choice).invoke("What is the weather in Paris?")
    if not message.tool_calls or message.tool_calls[0]["name"] != "get_weather":
        raise AssertionError(f"no get_weather call in {message!r}")
    return json.dumps(message.tool_calls[0]["args"])


def run_checks(base: str, model: str, work: Path) -> list[dict]:
    checks: list[tuple[str, Callable[[], str]]] = [
        ("lm-eval local-completions (loglikelihood, multiple choice)",
         lambda: check_lm_eval_loglikelihood(base, model, work)),
        ("lm-eval local-chat-completions (generate_until)", lambda: check_lm_eval_generation(base, model, work)),
        ("openai chat.completions.parse (nested pydantic model)", lambda: check_openai_parse(base, model)),
        ("instructor Mode.JSON_SCHEMA", lambda: check_instructor(base, model, "JSON_SCHEMA")),
        ("instructor Mode.TOOLS", lambda: check_instructor(base, model, "TOOLS")),
        ("langchain with_structured_output (json_schema)",
         lambda: check_langchain_structured(base, model, "json_schema")),
        ("langchain with_structured_output (function_calling)",
         lambda: check_langchain_structured(base, model, "function_calling")),
        ("langchain bind_tools (named tool)", lambda: check_langchain_tools(base, model)),
        ('langchain bind_tools (tool_choice "any", i.e. required)',
         lambda: check_langchain_tools(base, model, "any")),
        ("openai tool round trip (required call, tool reply, answer)",
         lambda: check_openai_tool_round_trip(base, model)),
    ]
    results = []
    for name, check in checks:
        start = time.perf_counter()
        try:
            detail, passed = check(), True
        except Exception as exc:  # a failing client is a result to report, not a crash
            detail, passed = f"{type(exc).__name__}: {exc}"[:300], False
            traceback.print_exc()
        results.append({"check": name, "passed": passed, "detail": detail,
                        "seconds": round(time.perf_counter() - start, 1)})
        print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}", flush=True)
    return results


def library_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("openai", "lm_eval", "instructor", "langchain-openai",
                                             "langchain-core")}


def render_docs(report: dict) -> str:
    rows = "\n".join(f"| {r['check']} | {'pass' if r['passed'] else '**fail**'} | {r['detail']} |"
                     for r in report["results"])
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    return f"""# FoloVLLM with the clients people use

Generated by `.venv-eco/bin/python scripts/ecosystem_check.py --write-docs` (the client libraries live
in their own virtualenv: `make ecosystem`). The script starts `folovllm serve {' '.join(SERVER_FLAGS)}`
on the default model (SmolLM2-135M-Instruct) and runs each client against it. A check passes when the
client gets a well-formed result (a parsed object, tool calls, an lm-eval score); the scores of a
135M model are reported, not judged.

Libraries: {versions}.

| check | result | detail |
|---|---|---|
{rows}

{sum(r['passed'] for r in report['results'])} of {len(report['results'])} checks pass.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running server (default: start one on a free port)")
    parser.add_argument("--model", help="the served model name (default: the server's first model)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "ecosystem.json"))
    parser.add_argument("--write-docs", action="store_true", help="also rewrite docs/ecosystem.md")
    args = parser.parse_args()

    os.environ.setdefault("OPENAI_API_KEY", "none")
    server = None
    base = args.base_url
    if base is None:
        port = free_port()
        server = start_server(port)
        base = f"http://127.0.0.1:{port}"
    try:
        model = args.model or httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_lm_eval_tasks(work)
            results = run_checks(base.rstrip("/"), model, work)
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    report = {"model": model, "versions": library_versions(), "results": results}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.write_docs:
        (ROOT / "docs" / "ecosystem.md").write_text(render_docs(report))
    print(f"{sum(r['passed'] for r in results)}/{len(results)} passed; wrote {args.out}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
