"""The feature matrix, the HTTP server on the device: `folovllm serve` for a generating model and for an
embedding model, side by side; the `openai` client streams a chat completion (equal to the whole reply),
forces a tool call whose arguments validate against the tool's schema, and embeds token ids as transformers
does on the same device. The CPU twin is slow (two servers; the server's own tests cover the CPU), and the GPU
check's rehearsal runs it."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.entrypoints.openai.conftest import MODEL_NAME, ServerProcess
from tests.matrix.engines import DEVICES
from tests.pooling.conftest import hf_hidden_states

MESSAGES = [{"role": "user", "content": "Which city should I visit?"}]
# enums and a boolean: a random model under the grammar ends the arguments in a few tokens
CITY_TOOL = {"type": "function", "function": {"name": "pick_city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "by_train": {"type": "boolean"}},
    "required": ["city", "by_train"]}}}


def servers(device: str, *models: tuple[str, ...]) -> list[ServerProcess]:
    """One server per model (its path and extra flags), each ready before the next starts: on CUDA each sizes its
    KV cache from what the device has free after a profiled forward, so the next one is given a larger share
    (and the matrix's other processes hold a little meanwhile)."""
    procs = []
    try:
        for i, model in enumerate(models):
            flags = ["--device", device, "--max-num-seqs", "8"]
            flags += ["--gpu-memory-utilization", f"{0.1 * (i + 1):.1f}"] if device == "cuda" else []
            procs.append(ServerProcess("--model", *model, *flags))
            procs[-1].wait_ready()
    except Exception:
        for proc in procs:
            proc.kill()
        raise
    return procs


def no_whitespace_bias(model_dir: str) -> dict[str, int]:
    """-100 on every token that is whitespace alone: JSON allows any amount of it between tokens, and a random
    model may prefer it until max_tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return {str(i): -100 for i in range(len(tokenizer)) if not tokenizer.decode([i]).strip()}


def assert_arguments_validate(arguments: str) -> None:
    schema = CITY_TOOL["function"]["parameters"]
    value = json.loads(arguments)
    assert set(value) == set(schema["required"]), value
    assert value["city"] in schema["properties"]["city"]["enum"] and isinstance(value["by_train"], bool)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_the_openai_client_streams_chat_calls_a_tool_and_embeds(embed_dir: str, device: str) -> None:
    """One tiny Llama with the default model's whole vocabulary (the chat template's ids fit), served to
    generate and to embed."""
    import openai

    chat_server, embed_server = servers(device, (embed_dir,), (embed_dir, "--runner", "pooling"))
    try:
        chat = openai.OpenAI(base_url=f"{chat_server.base_url}/v1", api_key="unused", max_retries=0)
        request = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0.0)
        whole = chat.chat.completions.create(**request).choices[0]
        chunks = list(chat.chat.completions.create(stream=True, **request))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.message.content and whole.finish_reason == "length"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

        named = {"type": "function", "function": {"name": "pick_city"}}
        reply = chat.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=[CITY_TOOL],
                                             tool_choice=named, max_tokens=40, temperature=0.0,
                                             logit_bias=no_whitespace_bias(embed_dir)).choices[0]
        [call] = reply.message.tool_calls
        assert call.function.name == "pick_city"
        assert_arguments_validate(call.function.arguments)

        embed = openai.OpenAI(base_url=f"{embed_server.base_url}/v1", api_key="unused", max_retries=0)
        prompts = [[5, 17, 300, 9, 41], [1000, 2000, 30, 40]]
        data = embed.embeddings.create(model=MODEL_NAME, input=prompts).data
        for item, hidden in zip(data, hf_hidden_states(embed_dir, prompts, device)):
            expected = F.normalize(hidden[-1], dim=-1)  # LAST, normalized: a decoder's default
            assert F.cosine_similarity(torch.tensor(item.embedding), expected, dim=0) >= 0.9999
    finally:
        for proc in (chat_server, embed_server):
            proc.stop()
            proc.kill()
