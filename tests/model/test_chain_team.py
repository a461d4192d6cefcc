"""The layer chain's team of threads (csrc/cpu_decoder_team.h): small decode steps on the team (int4, act-order
int4, bf16 linears) give the op calls' bits; the steps it leaves (many rows, long attention, other linears); an op's error inside the
team is raised, and the next step runs; the switch."""
from __future__ import annotations

import pytest
import torch

from folovllm.model.layer_chain import CHAIN_TEAM_ENV, TEAM_ATTENTION_COST, chain_team_enabled, layer_chain
from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable
from folovllm.model.quant.gptq_config import INT4_ACTIVATIONS_ENV, INT4_FUSED_MLP_ENV
from tests.helpers import make_attn_metadata
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.model.test_direct import ENGINE_OPS, prefill_then_decode
from tests.model.test_layer_chain import pytestmark as chain_marks

torch.set_num_threads(2)
NO_QUANT = cpu_quant_unavailable()
pytestmark = [*chain_marks, pytest.mark.skipif(NO_QUANT is not None, reason=f"{NO_QUANT}")]


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("team"))


@pytest.fixture(scope="module")
def act_order(tiny_llama, tmp_path_factory) -> str:  # noqa: F811
    """A GPTQ 4-bit g32 asymmetric act-order folder (each linear's input columns permuted per call)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("act-order"), sym=False, desc_act=True)[0]


def chain_with_team(model: CausalLM, team: str, monkeypatch) -> object:
    monkeypatch.setenv(CHAIN_TEAM_ENV, team)
    chain = layer_chain(model.model.direct_layers)
    assert chain is not None
    return chain


def decode_meta(rows: int, context: int, blocks: int = 4) -> object:
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(rows)]
    return make_attn_metadata([1] * rows, [context] * rows, tables, 16)


@pytest.mark.parametrize(("checkpoint", "fused_mlp", "threads"),
                         [("plain", "on", 2), ("plain", "off", 2), ("plain", "on", 1), ("act-order", "on", 2),
                          ("bf16", "on", 2)])
def test_small_int4_steps_run_on_the_team_with_the_same_bits(folders: tuple[str, str], act_order: str, checkpoint: str,
                                                            fused_mlp: str, threads: int, monkeypatch) -> None:
    monkeypatch.setenv(INT4_FUSED_MLP_ENV, fused_mlp)
    if checkpoint == "bf16":  # the same weights dequantized, on the bf16 linear kernel
        model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=True, **ENGINE_OPS)
    else:
        folder = folders[0] if checkpoint == "plain" else act_order
        model = load_model(folder, dtype=torch.bfloat16, device="cpu", quantize_lm_head="on", **ENGINE_OPS)
    team, ops = chain_with_team(model, "on", monkeypatch), chain_with_team(model, "off", monkeypatch)
    assert team.on_team(2, decode_meta(2, 14)) and not ops.on_team(2, decode_meta(2, 14))
    logits = {}
    torch.set_num_threads(threads)
    try:
        for name, chain in {"team": team, "ops": ops, "direct": None}.items():
            model.model.layer_chain = chain
            logits[name] = prefill_then_decode(model)  # its decode step: 2 rows, contexts 14 and 6
        model.model.use_direct_calls(False)  # the modules' forward: act-order's gather, then int4_gemm
        logits["modules"] = prefill_then_decode(model)
    finally:
        torch.set_num_threads(2)
    assert torch.equal(logits["team"], logits["ops"])
    assert torch.equal(logits["team"], logits["direct"])
    assert torch.equal(logits["team"], logits["modules"])


def test_steps_the_team_leaves(folders: tuple[str, str], monkeypatch) -> None:
    model = load_model(folders[0], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    chain = chain_with_team(model, "on", monkeypatch)
    kv_heads = model.arch.num_key_value_heads
    longest = -(-TEAM_ATTENTION_COST // kv_heads) - 1  # the longest context it takes at one row
    assert chain.on_team(1, decode_meta(1, longest, blocks=-(-longest // 16)))
    assert not chain.on_team(1, decode_meta(1, longest + 1, blocks=-(-(longest + 1) // 16)))
    assert not chain.on_team(9, decode_meta(9, 4))  # more rows than it splits well
    monkeypatch.setenv(INT4_ACTIVATIONS_ENV, "int8")  # int4 matmuls on int8 activations: not split by the team
    a8 = load_model(folders[0], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    assert not chain_with_team(a8, "on", monkeypatch).on_team(1, decode_meta(1, 4))


def test_an_error_inside_the_team_is_raised_and_the_next_step_runs(folders: tuple[str, str], monkeypatch) -> None:
    model = load_model(folders[0], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    model.model.layer_chain = chain_with_team(model, "on", monkeypatch)
    expected = prefill_then_decode(model)
    run = model.model.layer_chain._run

    def bad_slots(x, cos, sin, caches, slot_mapping, *rest):
        return run(x, cos, sin, caches, slot_mapping.float(), *rest)  # the K/V store's op refuses these

    model.model.layer_chain._run = bad_slots
    with pytest.raises(RuntimeError):
        prefill_then_decode(model)
    model.model.layer_chain._run = run
    assert torch.equal(prefill_then_decode(model), expected)


def test_switch(monkeypatch) -> None:
    monkeypatch.setenv(CHAIN_TEAM_ENV, "off")
    assert not chain_team_enabled()
    monkeypatch.setenv(CHAIN_TEAM_ENV, "maybe")
    with pytest.raises(ValueError, match=CHAIN_TEAM_ENV):
        chain_team_enabled()
