"""One device's worker: the model, its KV cache tensors, the model runner, decode CUDA graphs and each
seeded request's RNG. The engine feeds it plain ``StepInput``s and never touches the device itself.

Start-up runs in two phases, so that whoever owns several workers can agree on one cache size:
``determine_num_kv_blocks`` (what fits this device), then ``initialize_cache`` with the size agreed.
Under tensor parallelism each rank has a worker holding its slice of the model and of the KV heads;
the ranks agree on the smallest block count, and only rank 0 samples.
"""
from __future__ import annotations

import torch

from folovllm.attention.backend import get_attention_backend
from folovllm.attention.kv_quant import (
    KVCacheFormat,
    cache_element_dtype,
    cache_row_shape,
    check_backend_takes,
    kv_cache_format,
)
from folovllm.compilation import compile_model
from folovllm.config import EngineConfig
from folovllm.distributed.group import TPGroup
from folovllm.kv_transfer.base import KVConnectorBase, KVConnectorMetadata, KVTransferResult
from folovllm.lora.manager import LoRAManager
from folovllm.lora.request import LoRARequest
from folovllm.model.arch import ArchConfig
from folovllm.model.loader import load_model
from folovllm.platforms import platform_for
from folovllm.worker import cache_sizing
from folovllm.worker.cuda_graphs import capture_decode_graphs
from folovllm.worker.model_runner import KVCaches, LaunchedStep, ModelRunner
from folovllm.worker.step_input import StepInput, StepOutput


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int, dtype: torch.dtype, device: torch.device,
                       fmt: KVCacheFormat | None = None) -> KVCaches:
    """One preallocated K and V tensor per layer, ``[num_blocks, block_size, kv_heads, head_dim]`` (a
    quantized format: its codes with each row's scale after them, attention/kv_quant.py)."""
    shape = (num_blocks, block_size, num_kv_heads, cache_row_shape(head_dim, fmt))
    dtype = cache_element_dtype(dtype, fmt)
    return [(torch.zeros(shape, dtype=dtype, device=device),
             torch.zeros(shape, dtype=dtype, device=device)) for _ in range(num_layers)]


class Worker:
    """Owns everything on one device; ``launch``/``resolve`` (or ``execute``) run one step."""

    def __init__(self, config: EngineConfig, model_path: str, tp_group: TPGroup | None = None) -> None:
        """``config`` is resolved (``EngineConfig.resolve``): no setting is "auto". ``tp_group``: this
        worker's tensor-parallel rank (rank r runs on cuda:(r mod ranks per node) on CUDA); None for a
        single process."""
        self.config = config
        self.tp_group = tp_group
        self.platform = platform_for(config.torch_device, config.batch_invariant)
        self.device = self.platform.device
        if tp_group is not None:
            self.device = self.platform.rank_device(tp_group.rank % config.ranks_per_node)
        self.dtype = config.torch_dtype
        self.kv_format = kv_cache_format(config.kv_cache_dtype)
        if config.attention_backend == "triton" and not self.platform.runs_triton():
            raise ValueError(f"the triton attention backend does not run on {self.platform.name}: use "
                             "attention_backend 'torch' (or 'cpu' on a CPU); tests run it on CPU under TRITON_INTERPRET=1")
        backend = get_attention_backend(config.attention_backend, config.batch_invariant)
        check_backend_takes(backend, config.attention_backend, self.kv_format)
        torch.manual_seed(config.seed)  # unseeded sampling draws from the global RNG
        self.platform.set_threads(config.threads_per_rank)
        self.model = load_model(model_path, load_format=config.load_format, quantization=config.quantization,
                                dtype=self.dtype, device=self.device,
                                attn_backend=backend, seed=config.seed,
                                hf_overrides=config.hf_overrides, tp_group=tp_group,
                                load_quantized=config.load_quantized == "on",
                                quantize_lm_head=config.quantize_lm_head, platform=self.platform,
                                pooling=config.runner == "pooling", max_positions=config.max_model_len)
        self.platform.place_weights(self.model)
        if config.enable_lora and config.batch_invariant and self.platform.lora_op() is None:
            raise ValueError("batch-invariant mode with LoRA needs the lora_add kernel (each row's delta on its own); "
                             "the torch form multiplies each adapter's rows together: turn FOLOVLLM_CPU_LORA_KERNEL on "
                             "(a tier from avx2)")
        # adapters wrap the linears' methods before the compiled forms bind them
        self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank,
                                config.max_cpu_loras or config.max_loras,
                                self.platform.small_matmul_dtype(self.model.dtype),
                                kernel=self.platform.lora_op()) if config.enable_lora else None
        compile_model(self.model, self.platform)
        self.runner: ModelRunner | None = None  # built by initialize_cache (it keeps the per-request RNGs)
        self._previous: LaunchedStep | None = None  # the last step launched: pending inputs come from it
        self.kv_connector: KVConnectorBase | None = None  # worker side of PD disaggregation's connector

    @property
    def arch(self) -> ArchConfig:
        return self.model.arch

    # -- start-up -----------------------------------------------------------------------------

    def _block_bytes(self) -> int:
        arch = self.arch
        return cache_sizing.bytes_per_block(arch.num_hidden_layers, self.config.block_size,
                                            self.model.num_kv_heads, arch.head_dim, self.dtype, self.kv_format)

    def determine_num_kv_blocks(self, max_model_len: int) -> int:
        """How many KV blocks fit this device's memory budget (or ``num_gpu_blocks_override``); under
        tensor parallelism every rank calls it and all get the smallest rank's count."""
        cfg = self.config
        if cfg.num_gpu_blocks_override is not None:
            return cfg.num_gpu_blocks_override
        if self.platform.profiles_memory:
            budget = cache_sizing.cuda_kv_budget(self.model, cfg.max_num_batched_tokens, max_model_len, cfg.block_size,
                                                 cfg.gpu_memory_utilization, self.device)
        else:  # the ranks of one machine share its RAM: the budget is split between them
            budget = cache_sizing.cpu_kv_budget(cfg.kv_cache_memory) // cfg.ranks_per_node
        num_blocks = budget // self._block_bytes()
        if self.tp_group is not None:
            num_blocks = self.tp_group.all_reduce_min(num_blocks, self.device)
        return num_blocks

    def initialize_cache(self, num_blocks: int, max_model_len: int) -> None:
        """Allocates ``num_blocks`` KV blocks, captures the decode graphs, and readies the runner."""
        cfg, arch = self.config, self.arch
        kv_dtype = str(self.dtype).removeprefix("torch.") if self.kv_format is None else self.kv_format.name
        cache_sizing.log_capacity(num_blocks, cfg.block_size, self._block_bytes(), max_model_len, kv_dtype)
        caches = allocate_kv_caches(arch.num_hidden_layers, num_blocks, cfg.block_size,
                                    self.model.num_kv_heads, arch.head_dim, self.dtype, self.device, self.kv_format)
        graphs = None  # a graph would replay without the step's adapters: LoRA runs eager
        if self.platform.captures_graphs and self.lora is None:
            graphs = capture_decode_graphs(self.model, caches, cfg, max_model_len, self.platform)
        samples = self.tp_group is None or self.tp_group.is_first
        greedy_head = self.model.greedy_head() if self.platform.greedy_head else None
        self.runner = ModelRunner(self.model, caches, cfg.block_size, self.platform, graphs, samples, greedy_head,
                                  decode_input_buffers=not self.platform.asynchronous, lora=self.lora)

    # -- steps --------------------------------------------------------------------------------

    def launch(self, step: StepInput) -> LaunchedStep:
        """Queues one step on the device; its tokens come from ``resolve``. Tokens the step's inputs
        still await come from the step launched just before it."""
        if self.runner is None:
            raise RuntimeError("Worker.initialize_cache must run before the first step")
        for request_id in step.finished_request_ids:
            self.runner.forget(request_id)
        self._previous = self.runner.launch(step, self._previous)
        return self._previous

    def resolve(self, launched: LaunchedStep) -> StepOutput:
        """Waits for a launched step's sampled tokens."""
        return ModelRunner.resolve(launched)

    def execute(self, step: StepInput) -> StepOutput:
        """Launches one step and waits for its tokens."""
        return self.resolve(self.launch(step))

    # -- LoRA adapters ------------------------------------------------------------------------

    def add_lora(self, request: LoRARequest) -> None:
        """Loads and checks an adapter into the CPU pool (ValueError naming what does not fit)."""
        if self.lora is None:
            raise ValueError("LoRA is off: build the engine with enable_lora=True")
        self.lora.add(request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.lora is not None and self.lora.remove(lora_int_id)

    def list_loras(self) -> list[int]:
        return [] if self.lora is None else self.lora.list_loras()

    def check_health(self) -> None:
        """Nothing can fail apart from this process (``TensorParallelWorker`` checks its ranks here)."""

    def close(self) -> None:
        """Stops the KV connector's threads, if any (``TensorParallelWorker`` stops its ranks here)."""
        if self.kv_connector is not None:
            self.kv_connector.close()

    # -- KV transfer (PD disaggregation) ------------------------------------------------------

    def attach_kv_connector(self, connector: KVConnectorBase) -> dict:
        """Gives the connector's worker side this worker's KV tensors; returns its handshake metadata."""
        if self.runner is None:
            raise RuntimeError("Worker.initialize_cache must run before a KV connector is attached")
        connector.register_kv_caches(self.runner.kv_caches)
        self.kv_connector = connector
        return connector.handshake_metadata()

    def kv_transfer(self, meta: KVConnectorMetadata) -> KVTransferResult:
        """Carries out one step's KV orders (loads, then saves) and reports the transfers that ended."""
        self.kv_connector.start_load_kv(meta)
        self.kv_connector.save_kv(meta)
        return self.kv_connector.get_finished()
