"""The layer chain's team of threads (csrc/cpu/decoder_team.h): small decode steps on the team (int4, act-order
int4, bf16 linears) give the op calls' bits; the steps it leaves (many rows, long attention, other linears); an
op's error inside the team is raised, and the next step runs; the switch."""
from __future__ import annotations

import pytest
import torch

from folovllm.compilation.layer_chain import TEAM_ATTENTION_COST, layer_chain
from folovllm.model.layers import CausalLM
from tests.helpers import make_attn_metadata
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.model.test_direct import prefill_then_decode
from tests.model.test_layer_chain import chain_model
from tests.model.test_layer_chain import pytestmark as chain_marks
from tests.tiers import kernel_missing

torch.set_num_threads(2)
NO_TEAM = kernel_missing("team")
pytestmark = [chain_marks, pytest.mark.skipif(NO_TEAM is not None, reason=f"{NO_TEAM}")]


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("team"))


@pytest.fixture(scope="module")
def act_order(tiny_llama, tmp_path_factory) -> str:  # noqa: F811
    """A GPTQ 4-bit g32 asymmetric act-order folder (each linear's input columns permuted per call)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("act-order"), sym=False, desc_act=True)[0]


def chain_with_team(model: CausalLM, team: bool) -> object:
    chain = layer_chain(model.model.layers.compiled.direct, team)
    assert chain is not None
    return chain


def decode_meta(rows: int, context: int, blocks: int = 4) -> object:
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(rows)]
    return make_attn_metadata([1] * rows, [context] * rows, tables, 16)


@pytest.mark.parametrize(("checkpoint", "threads"),
                         [("plain", 2), ("plain", 1), ("act-order", 2), ("bf16", 2)])
def test_small_int4_steps_run_on_the_team_with_the_same_bits(folders: tuple[str, str], act_order: str, checkpoint: str,
                                                            threads: int) -> None:
    """int4 (its MLP one fused op), act-order int4, and bf16 linears (the MLP as three calls)."""
    if checkpoint == "bf16":  # the same weights dequantized, on our bf16 linear kernel
        model = chain_model(folders[1], torch.bfloat16, {"CPU_LINEAR": "folovllm"})
    else:
        folder = folders[0] if checkpoint == "plain" else act_order
        model = chain_model(folder, torch.bfloat16, quantize_lm_head="on")
    team, ops = chain_with_team(model, True), chain_with_team(model, False)
    assert team.on_team(2, decode_meta(2, 14)) and not ops.on_team(2, decode_meta(2, 14))
    logits = {}
    compiled = model.model.layers.compiled
    torch.set_num_threads(threads)
    try:
        for name, chain in {"team": team, "ops": ops, "direct": None}.items():
            compiled.chain = chain
            logits[name] = prefill_then_decode(model)  # its decode step: 2 rows, contexts 14 and 6
        model.model.layers.compiled = None  # the modules' forward: act-order's gather, then int4_gemm
        logits["modules"] = prefill_then_decode(model)
    finally:
        torch.set_num_threads(2)
    assert torch.equal(logits["team"], logits["ops"])
    assert torch.equal(logits["team"], logits["direct"])
    assert torch.equal(logits["team"], logits["modules"])


def test_steps_the_team_leaves(folders: tuple[str, str]) -> None:
    model = chain_model(folders[0], torch.bfloat16)
    chain = chain_with_team(model, True)
    kv_heads = model.arch.num_key_value_heads
    longest = -(-TEAM_ATTENTION_COST // kv_heads) - 1  # the longest context it takes at one row
    assert chain.on_team(1, decode_meta(1, longest, blocks=-(-longest // 16)))
    assert not chain.on_team(1, decode_meta(1, longest + 1, blocks=-(-(longest + 1) // 16)))
    assert not chain.on_team(9, decode_meta(9, 4))  # more rows than it splits well
    if kernel_missing("int4_a8") is None:  # int4 matmuls on int8 activations: not split by the team
        a8 = chain_model(folders[0], torch.bfloat16, {"INT4_ACTIVATIONS": "int8"})
        assert not chain_with_team(a8, True).on_team(1, decode_meta(1, 4))


def test_an_error_inside_the_team_is_raised_and_the_next_step_runs(folders: tuple[str, str]) -> None:
    model = chain_model(folders[0], torch.bfloat16, {"CPU_DECODER": "team"})
    chain = model.model.layers.compiled.chain
    assert chain.on_team(2, decode_meta(2, 14))
    expected = prefill_then_decode(model)
    run = chain._run

    def bad_slots(x, cos, sin, caches, slot_mapping, *rest):
        return run(x, cos, sin, caches, slot_mapping.float(), *rest)  # the K/V store's op refuses these

    chain._run = bad_slots
    with pytest.raises(RuntimeError):
        prefill_then_decode(model)
    chain._run = run
    assert torch.equal(prefill_then_decode(model), expected)


def test_switch(folders: tuple[str, str]) -> None:
    assert not chain_model(folders[0], torch.bfloat16, {"CPU_DECODER": "chain"}).model.layers.compiled.chain.on_team(
        1, decode_meta(1, 4))
    assert chain_model(folders[0], torch.bfloat16, {"CPU_DECODER": "team"}).model.layers.compiled.chain.on_team(
        1, decode_meta(1, 4))
