"""LoRA adapters end to end against transformers on the same weights: each adapter merged (W + scale·B·A) into
a copy of the fp32 HF model gives the reference greedy tokens; rows of three adapters and of the base model in
one batch each equal their own; the prefix cache keeps adapters apart; slots evict the least recently used."""
from __future__ import annotations

from pathlib import Path

import pytest

from folovllm import LoRARequest, SamplingParams
from tests.engine.conftest import make_llm, tiny_llama_dir  # noqa: F401
from tests.lora.adapters import ATTN, MLP, hf_greedy, merged_model, write_adapter

MAX_TOKENS = 6
PROMPTS = [[5, 17, 33, 40, 99, 7], [100, 200, 300, 3, 4, 5, 6, 7, 8, 9, 10]]
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
# (rank, targets, rsLoRA): different ranks and target sets, the packed q/k/v and gate/up pieces apart
SPECS = [(4, ("q_proj", "v_proj"), False), (8, ATTN + MLP, True), (16, ("gate_proj", "down_proj", "o_proj"), False)]


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir: str, tmp_path_factory) -> list[LoRARequest]:  # noqa: F811
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    root = tmp_path_factory.mktemp("adapters")
    return [LoRARequest(f"a{i}", i, str(write_adapter(root / f"a{i}", config, rank, targets, seed=i, rslora=rs)))
            for i, (rank, targets, rs) in enumerate(SPECS, start=1)]


@pytest.fixture(scope="module")
def references(tiny_llama_dir: str, adapters: list[LoRARequest]) -> dict:  # noqa: F811
    """(adapter name or None, prompt index) -> the merged HF model's greedy tokens."""
    refs = {}
    for lora in [None, *adapters]:
        model = merged_model(tiny_llama_dir, None if lora is None else Path(lora.lora_path))
        for i, prompt in enumerate(PROMPTS):
            refs[(lora and lora.lora_name, i)] = hf_greedy(model, prompt, MAX_TOKENS)
    return refs


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: str):  # noqa: F811
    return make_llm(tiny_llama_dir, enable_lora=True, max_loras=3, max_lora_rank=16)


def test_adapters_change_the_outputs(references: dict) -> None:
    for i in range(len(PROMPTS)):
        outputs = [references[(name, i)] for name in (None, "a1", "a2", "a3")]
        assert len({tuple(o) for o in outputs}) == 4


def test_mixed_batch_rows_equal_their_merged_reference(llm, adapters, references) -> None:
    """Every adapter and the base model, twice each, in one generate: one batch from the first step."""
    rows = [(prompt_index, lora) for prompt_index in range(len(PROMPTS)) for lora in [None, *adapters]]
    outs = llm.generate([PROMPTS[i] for i, _ in rows], GREEDY, lora_request=[lora for _, lora in rows],
                        use_tqdm=False)
    for (i, lora), out in zip(rows, outs):
        assert out.outputs[0].token_ids == references[(lora and lora.lora_name, i)], (i, lora)


def test_one_adapter_for_every_prompt(llm, adapters, references) -> None:
    outs = llm.generate(PROMPTS, GREEDY, lora_request=adapters[1], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [references[("a2", i)] for i in range(len(PROMPTS))]


def test_prefix_cache_keeps_adapters_apart(llm, adapters, references) -> None:
    prompt = PROMPTS[1] * 3  # several full blocks
    llm.reset_prefix_cache()
    first = llm.generate([prompt], GREEDY, lora_request=adapters[0], use_tqdm=False)[0]
    for lora in (adapters[1], None):  # the same prompt under another adapter, then the base: nothing shared
        out = llm.generate([prompt], GREEDY, lora_request=lora, use_tqdm=False)[0]
        assert out.num_cached_tokens == 0
    again = llm.generate([prompt], GREEDY, lora_request=adapters[0], use_tqdm=False)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_more_adapters_than_slots_evict_the_least_recently_used(tiny_llama_dir, adapters, references) -> None:  # noqa: F811
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_loras=1, max_cpu_loras=2, max_lora_rank=16)
    rows = [(i, lora) for i in range(len(PROMPTS)) for lora in adapters]
    outs = llm.generate([PROMPTS[i] for i, _ in rows], GREEDY, lora_request=[lora for _, lora in rows],
                        use_tqdm=False)
    for (i, lora), out in zip(rows, outs):
        assert out.outputs[0].token_ids == references[(lora.lora_name, i)]
    manager = llm.llm_engine.worker.lora
    assert len(manager.slot_ids) == 1 and len(manager.list_loras()) == 2  # the pool dropped the oldest
    outs = llm.generate(PROMPTS[:1], GREEDY, lora_request=adapters[0], use_tqdm=False)  # loaded again
    assert outs[0].outputs[0].token_ids == references[("a1", 0)]
