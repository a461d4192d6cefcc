"""16 concurrent streaming clients are batched together and get the offline engine's greedy text."""
from __future__ import annotations

import asyncio

NUM_CLIENTS = 16
MAX_TOKENS = 6


def test_concurrent_streams_match_offline(server, smol_llm):
    import openai

    from folovllm import SamplingParams

    prompts = [f"Fact number {i} about the number {i * 7}:" for i in range(NUM_CLIENTS)]

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str]:
        stream = await client.completions.create(model="smol", prompt=prompt, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True)
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_clients() -> list[tuple[str, str]]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="test-key",
                                      max_retries=0, timeout=120.0) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    served = asyncio.run(all_clients())
    offline = smol_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    for (text, finish), expected in zip(served, offline):
        assert text == expected.outputs[0].text
        assert finish == expected.outputs[0].finish_reason
