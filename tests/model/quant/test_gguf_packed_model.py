"""A GGUF model run in its file's types (load_quantized with our kernel): which tensors stay packed, the same
logits and greedy tokens as the dequantized model, the layer chain's team on it, the memory it takes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from folovllm import envs
from folovllm.compilation.layer_chain import layer_chain
from folovllm.model.layers.linear import LinearBase
from folovllm.model.loader import load_model
from folovllm.model.quantization.gguf_native import GGUFPackedLinearMethod, GGUFWeight
from folovllm.model.quantization.lm_head import Int8HeadMethod
from folovllm.platforms import platform_for
from tests.model.quant.gguf_files import Q, write_tiny_llama_gguf
from tests.model.test_direct import prefill_then_decode
from tests.model.test_layer_chain import chain_model
from tests.model.test_loader import prefill_logits
from tests.tiers import kernel_missing
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match, top2_gaps

NOT_BUILT = kernel_missing("gguf")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")

# layer 0: every packable type somewhere (q/k/v mixed); layer 1: v in F32, so the merged q/k/v is dequantized
LAYERS = [{"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q5_K, "ffn_gate": Q.Q4_0,
           "ffn_up": Q.Q4_1, "ffn_down": Q.Q8_0},
          {"attn_v": Q.F32, "ffn_down": Q.Q6_K}]


@pytest.fixture(scope="module")
def tied_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Tied head over a Q8_0 embedding table, as the default model has it."""
    path = tmp_path_factory.mktemp("gguf") / "tied.gguf"
    write_tiny_llama_gguf(path, LAYERS, embedding=Q.Q8_0, default=Q.Q4_K)
    return str(path)


@pytest.fixture(scope="module")
def untied_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Q6_K head of its own and a Q4_K embedding table, as a Q4_K_M file of a larger model has them."""
    path = tmp_path_factory.mktemp("gguf") / "untied.gguf"
    write_tiny_llama_gguf(path, LAYERS, embedding=Q.Q4_K, output=Q.Q6_K, default=Q.Q4_K)
    return str(path)


def test_fast_load_off_loads_the_same_model(untied_gguf: str) -> None:
    """FOLOVLLM_GGUF_FAST_LOAD off (gguf's reader as it is, numpy's pack_gguf, pages faulted as read): every
    buffer and parameter the same bytes as a load with it on."""
    with envs.overridden({"FOLOVLLM_GGUF_FAST_LOAD": "off"}):
        slow = _load(untied_gguf).state_dict()
    fast = _load(untied_gguf).state_dict()
    assert list(fast) == list(slow) and any(name.endswith("gguf.weight") for name in fast)
    for name, value in fast.items():
        assert value.dtype == slow[name].dtype and torch.equal(value, slow[name]), name


def _packed(model: torch.nn.Module) -> set[str]:
    return {name for name, m in model.named_modules()
            if isinstance(m, LinearBase) and isinstance(m.method, GGUFPackedLinearMethod)}


def _load(path: str, dtype: torch.dtype = torch.bfloat16, **kwargs) -> torch.nn.Module:
    return load_model(path, dtype=dtype, device="cpu", load_quantized=True, platform=platform_for("cpu"), **kwargs)


def test_which_tensors_stay_packed(tied_gguf: str, untied_gguf: str) -> None:
    tied = _load(tied_gguf, quantize_lm_head="auto")
    layer0 = {f"model.layers.0.{n}" for n in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                               "mlp.down_proj")}
    layer1 = {f"model.layers.1.{n}" for n in ("self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert _packed(tied) == layer0 | layer1 | {"lm_head"}
    table = tied.model.embed_tokens.row_table
    assert isinstance(table, GGUFWeight) and tied.lm_head.method.shared is table  # one table, read both ways
    assert not hasattr(tied.model.embed_tokens, "weight")
    assert tied.model.layers[1].self_attn.qkv_proj.weight.dtype == torch.bfloat16  # its F32 piece: dequantized
    untied = _load(untied_gguf, quantize_lm_head="auto")
    assert "lm_head" in _packed(untied) and untied.lm_head.gguf.pieces == [(int(Q.Q6_K), 320)]
    assert untied.model.embed_tokens.row_table.pieces == [(int(Q.Q4_K), 320)]
    # quantize_lm_head on: the head int8 as for any checkpoint (the tied table then dense, read from it)
    int8 = _load(tied_gguf, quantize_lm_head="on")
    assert isinstance(int8.lm_head.method, Int8HeadMethod) and "lm_head" not in _packed(int8)
    # our kernel switched off: the 4-bit linears for torch's int4 kernel, nothing else packed
    os.environ["FOLOVLLM_QUANT_KERNEL"] = "torch"
    try:
        torchs = _load(tied_gguf)
    finally:
        del os.environ["FOLOVLLM_QUANT_KERNEL"]
    assert not _packed(torchs)


@pytest.mark.parametrize("fixture", ["tied_gguf", "untied_gguf"])
def test_logits_match_the_dequantized_model(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    dense = load_model(path, dtype=torch.float32, device="cpu")
    ids = [5, 17, 3, 99, 42, 7, 250, 11, 64, 1, 300, 2]
    expected = prefill_logits(dense, ids)
    # fp32 activations: the weights are the file's values exactly, so only the sums' order differs
    got = prefill_logits(_load(path, torch.float32, quantize_lm_head="auto"), ids)
    torch.testing.assert_close(got, expected, atol=2e-4 * float(expected.abs().max()), rtol=1e-4)
    got = prefill_logits(_load(path, quantize_lm_head="auto"), ids, torch.bfloat16)
    torch.testing.assert_close(got.float(), expected, atol=0.05 * float(expected.abs().max()), rtol=0.05)


def _greedy(model: torch.nn.Module, prompt: list[int], steps: int, dtype: torch.dtype) -> tuple[list[int], list]:
    ids, step_logits = list(prompt), []
    for _ in range(steps):
        logits = prefill_logits(model, ids, dtype)[-1]
        step_logits.append(logits)
        ids.append(int(logits.float().argmax()))
    return ids[len(prompt):], step_logits


def test_greedy_tokens_agree_with_the_dequantized_model(untied_gguf: str) -> None:
    reference, gaps_from = _greedy(load_model(untied_gguf, dtype=torch.float32, device="cpu"), [5, 17, 3, 99], 12,
                                   torch.float32)
    packed, _ = _greedy(_load(untied_gguf, quantize_lm_head="auto"), [5, 17, 3, 99], 12, torch.bfloat16)
    assert_greedy_match(packed, reference, top2_gaps(gaps_from), BF16_TOP2_TOLERANCE)


NO_TEAM = kernel_missing("team")


@pytest.mark.skipif(NO_TEAM is not None, reason=f"{NO_TEAM}")
@pytest.mark.parametrize("threads", [1, 2])
def test_team_gives_the_ops_bits(tmp_path: Path, threads: int) -> None:
    """Every layer packed (mixed types in its q/k/v and down projections): a small decode step runs on the
    chain's team with gguf_gemm's own loops, the same bits as the op calls, the direct calls and the modules."""
    path = tmp_path / "all-packed.gguf"
    write_tiny_llama_gguf(path, [LAYERS[0], {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}], embedding=Q.Q8_0,
                          default=Q.Q4_K, vocab=512)  # prefill_then_decode's ids go up to 500
    assert_team_gives_the_ops_bits(chain_model(str(path), torch.bfloat16, load_quantized=True,
                                               quantize_lm_head="auto"), threads)


def assert_team_gives_the_ops_bits(model: torch.nn.Module, threads: int) -> None:
    """prefill_then_decode's logits on ``threads`` threads: the team's, the op calls', the direct calls' and the
    modules' all the same bits."""
    direct = model.model.layers.compiled.direct
    team, ops = layer_chain(direct, True), layer_chain(direct, False)
    assert team is not None and ops is not None
    logits, compiled = {}, model.model.layers.compiled
    torch.set_num_threads(threads)
    try:
        for name, chain in {"team": team, "ops": ops, "direct": None}.items():
            compiled.chain = chain
            logits[name] = prefill_then_decode(model)
        model.model.layers.compiled = None
        logits["modules"] = prefill_then_decode(model)
    finally:
        torch.set_num_threads(2)
    for name in ("ops", "direct", "modules"):
        assert torch.equal(logits["team"], logits[name]), name


RSS_SCRIPT = """
import json, sys, torch
from folovllm.model.loader import load_model
from folovllm.model.loader.loader import gguf_reader
from folovllm.platforms import kernel_library, platform_for

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

kernel_library.load()  # the library, the GGUF reader's modules: the process's, not the model's
gguf_reader()
before = anon_kib()
model = load_model(sys.argv[1], dtype=torch.bfloat16, device="cpu", load_quantized=True,
                   platform=platform_for("cpu"), quantize_lm_head="auto")
print(json.dumps({"anon_kib": anon_kib() - before, "weight_bytes": model.weight_bytes()}))
"""


def test_a_q4_k_m_files_memory_is_its_size(tmp_path: Path) -> None:
    """A file in Q4_K_M's mix (Q4_K, Q6_K for v and every other down projection and the head): loaded, the
    process holds at most 1.15 x the file's bytes more than before (no dequantized copy kept anywhere)."""
    path = tmp_path / "q4_k_m.gguf"
    layers = [{"attn_v": Q.Q6_K, **({"ffn_down": Q.Q6_K} if i % 2 == 0 else {})} for i in range(12)]
    write_tiny_llama_gguf(path, layers, embedding=Q.Q4_K, output=Q.Q6_K, default=Q.Q4_K, hidden=1024, inter=2816,
                          vocab=8192)
    size = path.stat().st_size
    done = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["weight_bytes"] <= 1.03 * size
    assert found["anon_kib"] * 1024 <= 1.15 * size, (found, size)


def _mapped_kib(path: str) -> int:
    """This process's resident KiB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        first = line.split(maxsplit=1)[0]
        if not first.endswith(":"):  # a mapping's header: its address range, ..., the file it maps
            inside = line.rstrip().endswith(path)
        elif inside and first == "Rss:":
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/smaps")
def test_loading_lets_go_of_the_files_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tensor's pages of the mapped file leave the process once its weights are copied: at the end of the
    load the process holds the weights it made, not the whole file beside them."""
    from folovllm.model.loader import gguf as loader_gguf

    path = (tmp_path / "q4_k_m.gguf").resolve()
    write_tiny_llama_gguf(path, [{"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}, {}], embedding=Q.Q4_K, output=Q.Q6_K,
                          default=Q.Q4_K, hidden=1024, inter=2816, vocab=8192)
    iterate, resident = loader_gguf.iter_gguf_weights, []

    def measured(*args: object, **kwargs: object):
        yield from iterate(*args, **kwargs)
        resident.append(_mapped_kib(str(path)))  # every tensor taken, the file still mapped

    monkeypatch.setattr(loader_gguf, "iter_gguf_weights", measured)
    model = _load(str(path), quantize_lm_head="auto")
    assert "lm_head" in _packed(model)  # the packed path, the file's own bytes, was the one taken
    assert len(resident) == 1 and resident[0] * 1024 < 0.05 * path.stat().st_size, (resident, path.stat().st_size)
