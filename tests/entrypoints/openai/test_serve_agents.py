"""The OpenAI Agents SDK on its default Responses model runs an agent with one function tool to the
end against the live server: the call is forced (the small model makes it), the tool runs, its output
goes back, and the model answers (tool_choice is reset to "auto" after a call: the server reads the
model's own tool calls with a parser)."""
from __future__ import annotations

import asyncio

import openai
import pytest

from tests.entrypoints.openai.conftest import API_KEY, MODEL_NAME

agents = pytest.importorskip("agents", reason="the openai-agents package (the test extra) is not installed")


@pytest.fixture(scope="module")
def agent_server(start_server):
    server = start_server("--api-key", API_KEY, "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        server.kill()


def _agent(server, calls: list[str]):
    agents.set_tracing_disabled(True)  # nothing leaves this machine

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny and 22 C in {city}."

    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    return agents.Agent(
        name="weather", instructions="Answer with the tool's result.", tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                            max_tokens=48))


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_an_agent_calls_its_tool_and_answers(agent_server, streamed):
    calls: list[str] = []
    agent = _agent(agent_server, calls)

    async def run():
        if not streamed:
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        result = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls[:1] == ["Paris"]
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert isinstance(result.final_output, str) and result.final_output
