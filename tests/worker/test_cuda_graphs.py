"""Decode CUDA graphs of the whole step: padding a decode batch leaves its real rows unchanged, and the engine
routed through the graph runner (replays run eagerly on CPU, through Triton's interpreter) gives the eager
engine's tokens, greedy and seeded sampled alike; on CUDA the replayed graphs give the eager engine's tokens and
steps at new batch sizes compile nothing."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.helpers import (
    BlockPool,
    make_attn_metadata,
    use_triton_interpreter_without_cuda,
)

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()  # before the kernels module is imported anywhere

from folovllm import SamplingParams  # noqa: E402
from folovllm.config import EngineConfig  # noqa: E402
from folovllm.model.loader import load_model  # noqa: E402
from folovllm.platforms import platform_for  # noqa: E402
from folovllm.platforms.cpu import CpuPlatform  # noqa: E402
from folovllm.platforms.cuda import CudaPlatform  # noqa: E402
from folovllm.platforms.triton_ops.sampling import exponential_race  # noqa: E402
from folovllm.sample.rows import SamplingRow  # noqa: E402
from folovllm.worker.cuda_graphs import CudaGraphRunner, capture_decode_graphs, capture_sizes  # noqa: E402
from folovllm.worker.graph_inputs import GraphInputs  # noqa: E402
from folovllm.worker.step_input import ScheduledRequest, StepInput  # noqa: E402
from folovllm.worker.worker import allocate_kv_caches  # noqa: E402
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: E402, F401
from tests.helpers import switches  # noqa: E402

torch.set_num_threads(2)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK_SIZE = 4
MAX_MODEL_LEN = 64
GREEDY_ROW = SamplingRow(SamplingParams(temperature=0.0))


def test_capture_sizes() -> None:
    assert capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(256)[-2:] == [248, 256]
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]


def test_graphs_only_on_cuda_with_the_triton_backend() -> None:
    assert not platform_for("cpu").captures_graphs  # the worker asks for graphs only where they are captured
    cuda = CudaPlatform(torch.device("cuda"))
    assert cuda.captures_graphs
    assert capture_decode_graphs(None, [], EngineConfig(device="cuda", attention_backend="torch"), 64, cuda) is None
    eager = EngineConfig(device="cuda", attention_backend="triton", enforce_eager=True)
    assert capture_decode_graphs(None, [], eager, 64, cuda) is None


class Sequences:
    """A tiny model, its paged KV caches, and a few sequences that step through them eagerly."""

    def __init__(self, model_dir: str, prompt_lens: list[int]) -> None:
        self.model = load_model(model_dir, dtype=torch.float32, device=DEVICE, attn_backend="triton")
        arch = self.model.arch
        num_blocks = 40
        self.kv_caches = allocate_kv_caches(arch.num_hidden_layers, num_blocks, BLOCK_SIZE,
                                            arch.num_key_value_heads, arch.head_dim, torch.float32, DEVICE)
        self.nan_block = num_blocks - 1  # never handed out; NaN shows any read of it
        for k_cache, v_cache in self.kv_caches:
            k_cache[self.nan_block], v_cache[self.nan_block] = float("nan"), float("nan")
        self.pool = BlockPool(num_blocks - 1, seed=3)
        gen = torch.Generator().manual_seed(0)
        self.tokens = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in prompt_lens]
        self.tables = [self.pool.grow([], n, BLOCK_SIZE) for n in prompt_lens]
        self.forward(list(range(len(prompt_lens))), prompt_lens)  # prefill every prompt

    def step_inputs(self, seqs: list[int], query_lens: list[int]):
        """input_ids, positions and metadata for the last query_lens[i] tokens of each sequence."""
        ids, positions = [], []
        for i, q_len in zip(seqs, query_lens):
            n = len(self.tokens[i])
            self.pool.grow(self.tables[i], n, BLOCK_SIZE)
            ids += self.tokens[i][n - q_len:]
            positions += range(n - q_len, n)
        meta = make_attn_metadata(query_lens, [len(self.tokens[i]) for i in seqs],
                                  [self.tables[i] for i in seqs], BLOCK_SIZE, device=DEVICE)
        return torch.tensor(ids, device=DEVICE), torch.tensor(positions, device=DEVICE), meta

    def decode_requests(self, seqs: list[int]) -> list[ScheduledRequest]:
        """The sequences' next decode step as a worker receives it."""
        return [ScheduledRequest(str(i), [self.tokens[i][-1]], 0, len(self.tokens[i]) - 1, list(self.tables[i]),
                                 GREEDY_ROW) for i in seqs]

    @torch.inference_mode()
    def forward(self, seqs: list[int], query_lens: list[int]) -> torch.Tensor:
        ids, positions, meta = self.step_inputs(seqs, query_lens)
        return self.model(ids, positions, self.kv_caches, meta)

    def add_tokens(self, seqs: list[int]) -> None:
        for i in seqs:
            self.tokens[i].append(7 + 13 * i)

    def snapshot(self) -> list[torch.Tensor]:
        return [c.clone() for pair in self.kv_caches for c in pair]

    def restore(self, snapshot: list[torch.Tensor]) -> None:
        for cache, saved in zip((c for pair in self.kv_caches for c in pair), snapshot):
            cache.copy_(saved)


@torch.inference_mode()
def test_padded_decode_rows_equal_the_unpadded_run(tiny_llama_dir) -> None:  # noqa: F811
    seqs = Sequences(tiny_llama_dir, [5, 9, 2])
    inputs = GraphInputs(8, -(-MAX_MODEL_LEN // BLOCK_SIZE), BLOCK_SIZE, 512, platform_for(DEVICE), DEVICE)
    inputs.block_tables.fill_(seqs.nan_block)  # stale columns must never be read
    for batch, size in [([0, 1, 2], 4), ([2], 4), ([0, 2], 8)]:  # smaller after larger: old rows become padding
        seqs.add_tokens(batch)
        ids, positions, meta = seqs.step_inputs(batch, [1] * len(batch))
        before = seqs.snapshot()
        expected = seqs.model(ids, positions, seqs.kv_caches, meta)
        expected_caches = seqs.snapshot()
        seqs.restore(before)

        inputs.stage(seqs.decode_requests(batch), [-1] * len(batch), size, None)
        assert torch.equal(inputs.input_ids(size)[:len(batch)], ids)
        hidden = seqs.model(inputs.input_ids(size), inputs.int_field("position", size), seqs.kv_caches,
                            inputs.metadata(size))
        torch.testing.assert_close(hidden[: len(batch)], expected, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(hidden).all()
        for cache, want in zip((c for pair in seqs.kv_caches for c in pair), expected_caches):
            torch.testing.assert_close(cache, want, equal_nan=True, atol=1e-5, rtol=1e-5)  # no pad writes


def test_input_tokens_come_from_the_host_or_the_previous_steps_rows() -> None:
    inputs = GraphInputs(4, 2, BLOCK_SIZE, 512, platform_for("cpu"), torch.device("cpu"))
    inputs.next_tokens[:3] = torch.tensor([70, 71, 72])  # the previous step's tokens, by its rows
    requests = [ScheduledRequest("a", [], 1, 4, [0, 1], GREEDY_ROW), ScheduledRequest("b", [9], 0, 2, [2], GREEDY_ROW),
                ScheduledRequest("c", [], 1, 0, [3], GREEDY_ROW)]
    inputs.stage(requests, [2, -1, 0], 4, None)
    assert inputs.input_ids(4).tolist() == [72, 9, 70, 0]
    assert inputs.int_field("slot", 4).tolist() == [1 * BLOCK_SIZE, 2 * BLOCK_SIZE + 2, 3 * BLOCK_SIZE, -1]
    assert inputs.int_field("seq_len", 4).tolist() == [5, 3, 1, 0]


class EagerReplay:
    """Stands in for a captured graph on CPU: replay() runs the captured step eagerly on the same buffers."""

    def __init__(self, runner: CudaGraphRunner, size: int, form: str) -> None:
        self.runner, self.size, self.form, self.replays = runner, size, form, 0

    def replay(self) -> None:
        self.runner.run_step(self.size, self.form)
        self.replays += 1


def stand_in_graphs(llm, graph_sampling: bool) -> CudaGraphRunner:
    """The engine's runner routed through a graph runner whose graphs replay eagerly (batch sizes 1, 2, 4, 8)."""
    model_runner = llm.llm_engine.worker.runner
    runner = CudaGraphRunner(model_runner.model, model_runner.kv_caches, BLOCK_SIZE, MAX_MODEL_LEN, 8,
                             model_runner.platform, graph_sampling)
    runner.graphs = {(size, form): EagerReplay(runner, size, form) for size in runner.sizes for form in runner.forms()}
    model_runner.cuda_graphs = runner
    return runner


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA tests below capture real graphs")
@pytest.mark.parametrize("graph_sampling", ["on", "off"])
def test_engine_through_the_graph_runner_gives_the_eager_tokens(tiny_llama_dir, graph_sampling: str,  # noqa: F811
                                                                monkeypatch) -> None:
    """Greedy rows, a seeded sampled row (temperature, top-k, top-p), a row asking for logprobs (the eager sampler
    after the greedy graph) and overlap scheduling (input tokens fetched on the device), with the counter-keyed
    draw both ways: the tokens of the engine without graphs. With graph sampling off, sampled steps replay the
    greedy graph and sample eagerly: the same tokens."""
    monkeypatch.setattr(CpuPlatform, "sampling_race", lambda self: exponential_race)
    prompts = random_prompts(5, seed=2, high=12)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + i, ignore_eos=True) for i in range(3)]
    params += [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True),
               SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=1)]
    outputs, runners = {}, {}
    for graphs in (False, True):
        with switches(CUDA_GRAPH_SAMPLING=graph_sampling):
            llm = make_llm(tiny_llama_dir, attention_backend="triton", max_model_len=MAX_MODEL_LEN,
                           overlap_scheduling=True)
            if graphs:
                runners[graphs] = stand_in_graphs(llm, graph_sampling == "on")
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs[graphs] = [o.outputs[0].token_ids for o in outs]
    assert outputs[True] == outputs[False]
    replays = {key: graph.replays for key, graph in runners[True].graphs.items()}
    greedy = sum(n for (_, form), n in replays.items() if form == "greedy")
    sampled = sum(n for (_, form), n in replays.items() if form == "sampled")
    assert replays[(8, "greedy")] > 0, replays  # 5 rows pad to 8; the logprobs row samples after the greedy graph
    assert greedy > 0 and (sampled > 0) == (graph_sampling == "on"), replays


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_with_cuda_graphs_matches_eager(tiny_llama_dir) -> None:  # noqa: F811
    prompts = random_prompts(11, seed=5)
    params = [SamplingParams(temperature=0.0 if i % 3 else 0.7, top_p=0.9, seed=i, max_tokens=4 + 3 * i,
                             ignore_eos=True) for i in range(11)]
    outputs = {}
    for eager in (True, False):
        llm = make_llm(tiny_llama_dir, attention_backend="triton", device="cuda", enforce_eager=eager,
                       cuda_graph_max_batch=8)
        graphs = llm.llm_engine.worker.runner.cuda_graphs
        assert (graphs is None) == eager
        if graphs is not None:
            assert sorted(graphs.graphs) == [(s, f) for s in (1, 2, 4, 8) for f in ("greedy", "sampled")]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs[eager] = [o.outputs[0].token_ids for o in outs]
    assert outputs[False] == outputs[True]


def triton_variants() -> int:
    """Compiled variants of every Triton kernel the engine launches, over devices."""
    from folovllm.attention import triton_decode, triton_kernels
    from folovllm.platforms.triton_ops import fused, sampling

    kernels = [triton_kernels._paged_attention_kernel, triton_kernels._store_kv_kernel,
               triton_decode._decode_split_kernel, fused._norm_kernel,
               fused._silu_mul_kernel, fused._rotary_store_kv_kernel, sampling._race_kernel]
    return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (graphs and Triton's compile cache)")
def test_steps_at_new_batch_sizes_compile_nothing(tiny_llama_dir) -> None:  # noqa: F811
    """Start-up (capture, its warm-up) compiles the decode kernels; then batches of sizes and lengths never seen
    before, greedy and sampled, eager prefill and replayed decode alike, compile no new variant."""
    llm = make_llm(tiny_llama_dir, attention_backend="triton", device="cuda", cuda_graph_max_batch=16)
    warm = [SamplingParams(temperature=t, max_tokens=3, ignore_eos=True) for t in (0.0, 0.7)]
    llm.generate([{"prompt_token_ids": p} for p in random_prompts(2, seed=1)], warm, use_tqdm=False)
    before = triton_variants()
    for count, seed in ((3, 2), (13, 3), (7, 4)):
        params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, top_k=5, max_tokens=2 + i, ignore_eos=True)
                  for i in range(count)]
        llm.generate([{"prompt_token_ids": p} for p in random_prompts(count, seed=seed, high=90)], params,
                     use_tqdm=False)
    assert triton_variants() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.inference_mode()
def test_replay_equals_eager_forward(tiny_llama_dir) -> None:  # noqa: F811
    seqs = Sequences(tiny_llama_dir, [5, 9, 2, 30, 1])
    runner = CudaGraphRunner(seqs.model, seqs.kv_caches, BLOCK_SIZE, MAX_MODEL_LEN, 4, platform_for(DEVICE))
    runner.capture()
    for batch in ([0, 1, 2], [3], [0, 1, 2, 4]):
        seqs.add_tokens(batch)
        ids, positions, meta = seqs.step_inputs(batch, [1] * len(batch))
        before = seqs.snapshot()
        expected = seqs.model.compute_logits(seqs.model(ids, positions, seqs.kv_caches, meta)).argmax(-1)
        seqs.restore(before)
        requests = seqs.decode_requests(batch)
        tokens, *_ = runner.launch(StepInput(requests), [None] * len(batch), {}, None, None)
        assert torch.equal(tokens, expected)
