"""The feature matrix, LoRA and speculative decoding: a batch mixing three adapters and the base model equals
transformers with each adapter merged, on the same device; n-gram and draft-model speculation give the greedy
tokens of no speculation on the same device. CPU twins here; CUDA cases in the GPU check."""
from __future__ import annotations

from pathlib import Path

import pytest

from folovllm import LoRARequest
from tests.engine.test_spec_decode import NGRAM, grounded_prompts
from tests.lora.adapters import merged_model, write_adapter
from tests.lora.test_lora_generate import PROMPTS, SPECS
from tests.matrix.engines import DEVICES, count_graph_replays, engine, greedy
from tests.tolerance import assert_greedy_match, hf_greedy, logprob_gaps

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def adapters(llama_dir: str, tmp_path_factory) -> list[LoRARequest]:
    """The LoRA tests' three adapters: different ranks and target sets, one rsLoRA."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(llama_dir)
    root = tmp_path_factory.mktemp("matrix_adapters")
    return [LoRARequest(f"a{i}", i, str(write_adapter(root / f"a{i}", config, rank, targets, seed=i, rslora=rs)))
            for i, (rank, targets, rs) in enumerate(SPECS, start=1)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_lora_batch_equals_each_adapter_merged(llama_dir: str, adapters: list[LoRARequest],
                                                       device: str) -> None:
    references = {}
    for lora in [None, *adapters]:
        model = merged_model(llama_dir, None if lora is None else Path(lora.lora_path)).to(device)
        for i, prompt in enumerate(PROMPTS):
            references[(lora and lora.lora_name, i)] = hf_greedy(model, prompt, MAX_TOKENS)
    llm = engine(llama_dir, device, enable_lora=True, max_loras=3, max_lora_rank=16)
    rows = [(i, lora) for i in range(len(PROMPTS)) for lora in [None, *adapters]]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for i, _ in rows], greedy(MAX_TOKENS),
                        lora_request=[lora for _, lora in rows], use_tqdm=False)
    for (i, lora), out in zip(rows, outs):
        assert_greedy_match(out.outputs[0].token_ids, *references[(lora and lora.lora_name, i)])


def run(llm, prompts: list[dict]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy(16), use_tqdm=False)]


@pytest.mark.parametrize("speculation", ["ngram", "draft"])
@pytest.mark.parametrize("device", DEVICES)
def test_speculation_keeps_the_greedy_tokens(llama_dir: str, device: str, speculation: str) -> None:
    """Against no speculation on the same device, by the top-2 rule (a verify step's k + 1 rows are computed in
    another shape than a decode step's one, so on a GPU their floats may part at a near-tie). The draft model is
    the target's own weights in its own engine, so its proposals are accepted (n-gram's are mostly rejected)."""
    prompts = grounded_prompts(4, seed=1)
    plain = engine(llama_dir, device).generate(prompts, greedy(16), use_tqdm=False)
    config = NGRAM if speculation == "ngram" else {"model": llama_dir, "num_speculative_tokens": 3}
    llm = engine(llama_dir, device, speculative_config=config)
    replays = count_graph_replays(llm)
    for tokens, ref in zip(run(llm, prompts), plain):
        assert_greedy_match(tokens, ref.outputs[0].token_ids, logprob_gaps(ref.outputs[0]))
    stats = llm.llm_engine.stats
    print(f"{device} {speculation}: {stats.spec_decode_num_accepted_tokens} of {stats.spec_decode_num_draft_tokens} "
          f"proposed tokens accepted, {replays[0]} graph replays")
    assert stats.spec_decode_num_accepted_tokens > 0 and llm.llm_engine.kv_cache.num_used_blocks == 0
