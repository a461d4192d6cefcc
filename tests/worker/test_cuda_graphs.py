"""Decode CUDA graphs: padding a decode batch leaves its real rows unchanged (checked on CPU through
Triton's interpreter, eagerly), and on CUDA the replayed graphs give the eager engine's tokens."""
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

from folovllm.config import EngineConfig  # noqa: E402
from folovllm.model.loader import load_model  # noqa: E402
from folovllm.worker.cuda_graphs import (  # noqa: E402
    DecodeInputs,
    capture_decode_graphs,
    capture_sizes,
)
from folovllm.worker.worker import allocate_kv_caches  # noqa: E402
from folovllm.platforms import platform_for
from folovllm.platforms.cuda import CudaPlatform
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: E402, F401

torch.set_num_threads(2)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK_SIZE = 4
MAX_MODEL_LEN = 64


def test_capture_sizes() -> None:
    assert capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(256)[-2:] == [248, 256]
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]


def test_graphs_only_on_cuda_with_the_triton_backend() -> None:
    assert not platform_for("cpu").captures_graphs  # the worker asks for graphs only where they are captured
    assert CudaPlatform(torch.device("cuda")).captures_graphs
    assert capture_decode_graphs(None, [], EngineConfig(device="cuda", attention_backend="torch"), 64) is None
    eager = EngineConfig(device="cuda", attention_backend="triton", enforce_eager=True)
    assert capture_decode_graphs(None, [], eager, 64) is None


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


@pytest.mark.parametrize("steps", [[([0, 1, 2], 4), ([2], 4), ([0, 2], 8)]])
@torch.inference_mode()
def test_padded_decode_rows_equal_the_unpadded_run(tiny_llama_dir, steps) -> None:  # noqa: F811
    seqs = Sequences(tiny_llama_dir, [5, 9, 2])
    inputs = DecodeInputs.allocate(8, -(-MAX_MODEL_LEN // BLOCK_SIZE), BLOCK_SIZE, DEVICE)
    inputs.block_tables.fill_(seqs.nan_block)  # stale columns must never be read
    for batch, size in steps:  # a smaller batch after a larger one: old rows must turn into padding
        seqs.add_tokens(batch)
        ids, positions, meta = seqs.step_inputs(batch, [1] * len(batch))
        before = seqs.snapshot()
        expected = seqs.model(ids, positions, seqs.kv_caches, meta)
        expected_caches = seqs.snapshot()
        seqs.restore(before)

        padded = inputs.fill(ids, positions, meta, size)
        assert padded[0].shape[0] == size and padded[2].num_seqs == size
        hidden = seqs.model(padded[0], padded[1], seqs.kv_caches, padded[2])
        torch.testing.assert_close(hidden[: len(batch)], expected, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(hidden).all()
        for cache, want in zip((c for pair in seqs.kv_caches for c in pair), expected_caches):
            torch.testing.assert_close(cache, want, equal_nan=True, atol=1e-5, rtol=1e-5)  # no pad writes


def test_fill_rejects_batches_that_are_not_decode_or_do_not_fit(tiny_llama_dir) -> None:  # noqa: F811
    inputs = DecodeInputs.allocate(4, 2, BLOCK_SIZE, torch.device("cpu"))
    meta = make_attn_metadata([2, 1], [2, 3], [[0], [1]], BLOCK_SIZE)
    with pytest.raises(ValueError, match="not a decode batch"):
        inputs.fill(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), meta, 4)
    meta = make_attn_metadata([1] * 5, [1] * 5, [[0]] * 5, BLOCK_SIZE)
    with pytest.raises(ValueError, match="not a decode batch"):
        inputs.fill(torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64), meta, 4)


class EagerReplay:
    """Stands in for a captured graph on CPU: replay() runs the model on the same static views."""

    def __init__(self, runner, size: int) -> None:
        self.runner, self.size, self.replays = runner, size, 0
        self.views = runner.inputs.view(size)
        runner.outputs[size] = torch.empty(size, runner.model.arch.hidden_size)

    def replay(self) -> None:
        input_ids, positions, meta = self.views
        hidden = self.runner.model(input_ids, positions, self.runner.kv_caches, meta)
        self.runner.outputs[self.size].copy_(hidden)
        self.replays += 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA tests below capture real graphs")
def test_engine_routes_decode_steps_through_the_graph_runner(tiny_llama_dir) -> None:  # noqa: F811
    """The plumbing of CudaGraphRunner.run and ModelRunner, with replay done eagerly on CPU."""
    from folovllm import SamplingParams
    from folovllm.worker.cuda_graphs import CudaGraphRunner

    prompts = random_prompts(5, seed=2, high=12)
    params = [SamplingParams(temperature=0.0, max_tokens=2 + 2 * i, ignore_eos=True) for i in range(5)]
    outputs = {}
    for graphs in (False, True):
        llm = make_llm(tiny_llama_dir, attention_backend="triton", max_model_len=64)
        engine = llm.llm_engine
        if graphs:
            model_runner = engine.worker.runner
            runner = CudaGraphRunner(model_runner.model, model_runner.kv_caches, 4, 64, 4, torch.device("cpu"))
            runner.graphs = {size: EagerReplay(runner, size) for size in runner.sizes}
            model_runner.cuda_graphs = runner
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs[graphs] = [o.outputs[0].token_ids for o in outs]
    assert outputs[True] == outputs[False]
    replays = {size: graph.replays for size, graph in runner.graphs.items()}
    assert replays[4] > 0 and replays[1] > 0, replays  # batches of 3 and 4 pad to 4; the last runs alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_with_cuda_graphs_matches_eager(tiny_llama_dir) -> None:  # noqa: F811
    from folovllm import SamplingParams

    prompts = random_prompts(11, seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(11)]
    outputs = {}
    for eager in (True, False):
        llm = make_llm(tiny_llama_dir, attention_backend="triton", device="cuda", enforce_eager=eager,
                       cuda_graph_max_batch=8)
        graphs = llm.llm_engine.worker.runner.cuda_graphs
        assert (graphs is None) == eager
        if graphs is not None:
            assert sorted(graphs.graphs) == [1, 2, 4, 8]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs[eager] = [o.outputs[0].token_ids for o in outs]
    assert outputs[False] == outputs[True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.inference_mode()
def test_replay_equals_eager_forward(tiny_llama_dir) -> None:  # noqa: F811
    from folovllm.worker.cuda_graphs import CudaGraphRunner

    seqs = Sequences(tiny_llama_dir, [5, 9, 2, 30, 1])
    runner = CudaGraphRunner(seqs.model, seqs.kv_caches, BLOCK_SIZE, MAX_MODEL_LEN, 4, DEVICE)
    runner.capture()
    for batch in ([0, 1, 2], [3], [0, 1, 2, 4], [0, 1, 2, 3, 4]):
        seqs.add_tokens(batch)
        ids, positions, meta = seqs.step_inputs(batch, [1] * len(batch))
        before = seqs.snapshot()
        expected = seqs.model(ids, positions, seqs.kv_caches, meta)
        seqs.restore(before)
        if not runner.can_run(ids, meta):
            assert len(batch) > 4
            continue
        torch.testing.assert_close(runner.run(ids, positions, meta), expected, atol=1e-5, rtol=1e-5)
