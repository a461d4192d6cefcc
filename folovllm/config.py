"""Engine configuration: one frozen dataclass of knobs, validated on construction, resolved once.

Each field's metadata carries its command-line help (and choices, or a flag name that differs from
``--field-name``), so the CLI is derived from this class and no default is written twice.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from folovllm.config_checks import (
    CONVERTS,
    KV_ROLES,
    RUNNERS,
    check_kv_transfer,
    check_lora,
    check_nodes,
    check_runner,
)
from folovllm.config_resolve import resolve_config, usable_cores
from folovllm.platforms import platform_for, resolve_device
from folovllm.spec_decode.config import SpeculativeConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
               "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30}
DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30
# vLLM's --kv-transfer-config: its kv_role values, and the keys read here
QUANTIZATIONS = ("auto", "gptq", "int8")
LOAD_QUANTIZED = ("auto", "on", "off")
QUANTIZE_LM_HEAD = ("auto", "on", "off")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other spellings
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")  # fp8 = fp8_e4m3, as in vLLM
DP_ROUTING_POLICIES = ("prefix_aware", "least_loaded", "round_robin")


def parse_size(text: str | int) -> int:
    """Parses a memory size like ``512MiB``, ``2GiB`` or a plain byte count."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot parse memory size {text!r}; use e.g. 512MiB or 2GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


# The option groups of `folovllm serve --help`, in vLLM's order (vLLM's config class names); the
# last holds the knobs only FoloVLLM has.
CONFIG_GROUPS = ("ModelConfig", "LoadConfig", "DeviceConfig", "CacheConfig", "ParallelConfig",
                 "SchedulerConfig", "StructuredOutputsConfig", "CompilationConfig", "ObservabilityConfig",
                 "KVTransferConfig", "LoRAConfig", "SpeculativeConfig", "FoloVLLM")
NO_EFFECT = "accepted for compatibility, has no effect"


def knob(default: Any, help: str | None = None, *, choices: list[str] | None = None,
         flag: str | None = None, cli: bool = True, group: str = "FoloVLLM",
         aliases: tuple[str, ...] = (), no_effect: str | None = None,
         only: tuple[Any, str] | None = None) -> Any:
    """A config field with its command-line description.

    ``flag``: the option's name when it is not ``--field-name`` (a ``--no-x`` flag turns a field off;
    a boolean that defaults to True gets a ``--x`` / ``--no-x`` pair, as vLLM's flags do);
    ``cli=False``: the field has no flag (set it from Python); ``group``: its section of ``--help``
    (one of CONFIG_GROUPS); ``aliases``: more names for the same option (for a boolean, an alias
    starting with ``--no-`` turns it off); ``no_effect``: why a non-default value cannot change
    anything here (the engine warns once that it is ignored); ``only``: (the one value implemented,
    the feature any other value needs), since a setting whose absence would change results is an error.
    """
    if group not in CONFIG_GROUPS:
        raise ValueError(f"unknown config group {group!r}; use one of {CONFIG_GROUPS}")
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, "cli": cli,
                                             "group": group, "aliases": tuple(aliases),
                                             "no_effect": no_effect, "only": only})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine knob, with vLLM's names where vLLM has one.

    ``auto`` values are decided by ``resolve()``, once, when the engine starts; code below the
    engine reads resolved values only.
    """

    # -- ModelConfig ------------------------------------------------------------------------------
    model: str | None = knob(None, "a .gguf file, an HF folder or a Hugging Face hub id (local cache first; "
                                   "default: SmolLM2-135M-Instruct)", group="ModelConfig")
    tokenizer: str | None = knob(None, "the tokenizer's folder, .gguf file or hub id (default: the model's)",
                                 group="ModelConfig")
    revision: str | None = knob(None, "hub id: the branch, tag or commit to use (default: main)",
                                group="ModelConfig")
    trust_remote_code: bool = knob(False, "FoloVLLM runs its own model code only", group="ModelConfig",
                                   no_effect="code from a model repository is never run")
    dtype: str = knob("auto", "auto = the platform's choice (bfloat16 where its matmuls are fast: a GPU, a CPU "
                              "with native bf16 or our linear kernel; else float32); half = float16, float = float32",
                      choices=["auto", *_DTYPES], group="ModelConfig")
    seed: int = knob(0, "seed for dummy weights and torch", group="ModelConfig")
    max_model_len: int | None = knob(None, "longest prompt + output (default: the model's maximum)",
                                     group="ModelConfig")
    quantization: str = knob("auto", "auto: as the checkpoint says; gptq: insist on a GPTQ checkpoint; "
                                     "int8: quantize a float checkpoint's linear weights to int8 at load",
                             choices=list(QUANTIZATIONS), group="ModelConfig", aliases=("-q",))
    enforce_eager: bool = knob(False, "CUDA: no CUDA graphs for decode steps", group="ModelConfig")
    max_logprobs: int = knob(20, "most logprobs (and prompt logprobs) a request may ask for; -1: no "
                                 "limit beyond SamplingParams' own (20)", group="ModelConfig")
    hf_overrides: dict[str, Any] | None = knob(
        None, "JSON merged into the model's config.json, e.g. '{\"max_position_embeddings\": 4096}'",
        group="ModelConfig")
    generation_config: str = knob(
        "auto", "auto: the model's generation_config.json gives the default sampling settings "
                "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens); vllm: "
                "SamplingParams' own defaults; or a folder holding a generation_config.json",
        group="ModelConfig")
    runner: str = knob("auto", "generate: text generation; pooling: embeddings and scores (embed, score, "
                               "/v1/embeddings, /score, /rerank, /pooling); auto: pooling when --convert embed, "
                               "else generate", choices=list(RUNNERS), group="ModelConfig")
    convert: str = knob("auto", "embed: serve a generative (*ForCausalLM) checkpoint as an embedding model "
                                "(its final normed hidden states pooled, the LM head unused); auto: embed "
                                "under --runner pooling", choices=list(CONVERTS), group="ModelConfig")
    pooler_config: dict[str, Any] | None = knob(
        None, "pooling runner: JSON with pooling_type (LAST, MEAN, CLS, ALL) and normalize, e.g. "
              "'{\"pooling_type\": \"MEAN\", \"normalize\": true}' (default: the model folder's "
              "sentence-transformers config, else LAST, normalized)", group="ModelConfig")
    # -- LoadConfig -------------------------------------------------------------------------------
    load_format: str = knob("auto", "dummy: random weights from the model's config (tests, ablations)",
                            choices=["auto", "dummy"], group="LoadConfig")
    download_dir: str | None = knob(None, "hub ids: the Hugging Face cache folder (default: $HF_HOME/hub)",
                                    group="LoadConfig")
    load_quantized: str = knob(
        "auto", "GGUF on CPU: keep the file's quantized tensors in their types (on: with our kernel every "
                "linear, the embedding and the LM head in Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K; with torch's the 4-bit "
                "linears) or dequantize them to the model dtype (off). auto = on for a GGUF file's own weights "
                "where our GGUF kernel runs (the platform decides; docs/gguf.md), else off",
        choices=list(LOAD_QUANTIZED), group="LoadConfig")
    quantize_lm_head: str = knob(
        "auto", "hold the LM head (a tied one: the embedding table too) as int8 with one scale per vocabulary "
                "row (on) or in the model dtype (off); auto = on when the linear weights are quantized on the "
                "CPU (GPTQ, --quantization int8, --load-quantized on), where the head's matmul is the largest "
                "read of a decode step",
        choices=list(QUANTIZE_LM_HEAD))
    # -- DeviceConfig -----------------------------------------------------------------------------
    device: str = knob("auto", "auto = cuda if available, else cpu; or cpu, cuda, cuda:N", group="DeviceConfig")
    # -- CacheConfig ------------------------------------------------------------------------------
    block_size: int = knob(16, "tokens per KV cache block", group="CacheConfig")
    kv_cache_memory: int | str | None = knob(None, "CPU KV cache size, e.g. 2GiB (default)", group="CacheConfig")
    gpu_memory_utilization: float = knob(0.9, "CUDA: fraction of device memory the engine may use",
                                         group="CacheConfig")
    num_gpu_blocks_override: int | None = knob(None, "fixes the block count (tests, ablations)", cli=False,
                                               group="CacheConfig")
    kv_cache_dtype: str = knob(
        "auto", "auto: K/V in the model's dtype; int8, fp8 (= fp8_e4m3), fp8_e5m2: one-byte codes with a float16 "
                "scale per token and KV head, set as each row is written (about 2x the tokens of bfloat16 in "
                "the same memory)", choices=list(KV_CACHE_DTYPES), group="CacheConfig")
    calculate_kv_scales: bool = knob(
        False, "per-tensor fp8 KV scales from the first batch (not built: each quantized row carries its own "
               "scale, set as it is written)", group="CacheConfig",
        only=(False, "per-tensor KV scales from the first batch (a quantized KV cache here scales each token's "
                     "row per KV head as it is written)"))
    enable_prefix_caching: bool = knob(True, "automatic prefix caching (--no-prefix-caching: off, for ablation)",
                                       flag="--enable-prefix-caching", aliases=("--no-prefix-caching",),
                                       group="CacheConfig")
    swap_space: float | None = knob(None, "GiB of CPU swap space per GPU", group="CacheConfig",
                                    no_effect="preempted requests are recomputed, never swapped")
    cpu_offload_gb: float | None = knob(None, "GiB of weights to keep in CPU memory", group="CacheConfig",
                                        no_effect="weights are never offloaded")
    # -- ParallelConfig ---------------------------------------------------------------------------
    tensor_parallel_size: int = knob(
        1, "split every layer across N ranks (processes spawned by the engine; gloo on CPU, NCCL on CUDA)",
        group="ParallelConfig", aliases=("-tp",))
    nnodes: int = knob(1, "machines the tensor-parallel ranks span, tensor_parallel_size / nnodes ranks on each "
                          "(docs/distributed.md)", group="ParallelConfig")
    node_rank: int = knob(0, "this machine's index among the nnodes: 0 runs the engine (and the server) and "
                             "its ranks; R >= 1 runs only ranks R*T/N .. (R+1)*T/N-1", group="ParallelConfig")
    master_addr: str | None = knob(None, "node 0's address, reachable from every node: node 0 listens there "
                                         "(default: 127.0.0.1; required with --nnodes > 1)", group="ParallelConfig")
    master_port: int | None = knob(None, "the rendezvous port on --master-addr (default: a free one, picked by "
                                         "the OS; required with --nnodes > 1)", group="ParallelConfig")
    data_parallel_size: int = knob(
        1, "serve: N engine replicas (processes, each with its own scheduler and KV cache) behind one "
           "server; CPU threads are split between them", group="ParallelConfig", aliases=("-dp",))
    dp_routing: str = knob(
        "prefix_aware", "data parallelism: which replica a new request goes to: prefix_aware (the one that "
                        "holds its prompt's prefix, unless much busier), least_loaded (fewest outstanding "
                        "tokens), round_robin", choices=list(DP_ROUTING_POLICIES), group="ParallelConfig")
    # -- SchedulerConfig --------------------------------------------------------------------------
    max_num_seqs: int = knob(256, "most requests running at once", group="SchedulerConfig")
    max_num_batched_tokens: int = knob(2048, "most tokens one step computes", group="SchedulerConfig")
    enable_chunked_prefill: bool = knob(True, "split long prompts into chunks that share steps with "
                                              "decodes (--no-chunked-prefill: prefill whole prompts in one step)",
                                        flag="--enable-chunked-prefill", aliases=("--no-chunked-prefill",),
                                        group="SchedulerConfig")
    long_prefill_token_threshold: int = knob(
        0, "cap each prompt's chunk per step so short requests can join (0 = off)", group="SchedulerConfig")
    scheduling_policy: str = knob("fcfs", "the order in which waiting requests are admitted",
                                  group="SchedulerConfig")
    # -- CompilationConfig ------------------------------------------------------------------------
    cuda_graph_max_batch: int = knob(256, "CUDA: the largest decode batch captured in a CUDA graph",
                                     group="CompilationConfig")
    # -- ObservabilityConfig ----------------------------------------------------------------------
    disable_log_stats: bool = knob(False, "do not log engine statistics", group="ObservabilityConfig",
                                   no_effect="the engine logs no periodic statistics; /metrics is always served")
    trace_path: str | None = knob(
        None, "write the step trace (JSONL: tokens by kind, running, waiting, KV) here", flag="--trace",
        group="ObservabilityConfig")
    # -- KVTransferConfig (PD disaggregation, docs/distributed.md) ---------------------------------
    kv_transfer_config: dict[str, Any] | None = knob(
        None, "vLLM's JSON, e.g. '{\"kv_connector\": \"SharedStorageConnector\", \"kv_role\": \"kv_both\", "
              "\"kv_connector_extra_config\": {\"shared_storage_path\": \"/tmp/kv\"}}'; kv_role and "
              "kv_connector set --kv-role and --kv-connector; also kv_ip, kv_port, engine_id",
        group="KVTransferConfig")
    kv_role: str | None = knob(None, "PD disaggregation: producer (prefills, holds the KV for a consumer), "
                                     "consumer (pulls the KV, decodes) or both",
                               choices=list(KV_ROLES), group="KVTransferConfig")
    kv_connector: str | None = knob(None, "how KV moves between instances (default with --kv-role: "
                                          "torch_distributed)", group="KVTransferConfig")
    kv_transfer_timeout: float = knob(120.0, "seconds a producer holds a finished request's KV for its "
                                             "consumer, and a consumer waits for a pull", group="KVTransferConfig")
    # -- LoRAConfig (docs/lora.md) ---------------------------------------------------------------
    enable_lora: bool = knob(False, "serve LoRA adapters (PEFT folders) on the base model, many in one batch",
                             group="LoRAConfig")
    max_loras: int = knob(1, "LoRA: adapters one step may use (slots)", group="LoRAConfig")
    max_lora_rank: int = knob(16, "LoRA: the largest adapter rank accepted", group="LoRAConfig")
    max_cpu_loras: int | None = knob(None, "LoRA: adapters kept loaded in CPU memory, least recently used "
                                           "dropped first (default: max_loras)", group="LoRAConfig")
    # -- SpeculativeConfig (docs/speculative_decoding.md) ----------------------------------------------
    speculative_config: dict[str, Any] | None = knob(
        None, "JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}' or "
              "'{\"model\": DRAFT, \"num_speculative_tokens\": 4}'; optional disable_by_batch_size; "
              "turns overlap scheduling off", group="SpeculativeConfig")
    # -- FoloVLLM's own knobs ---------------------------------------------------------------------
    attention_backend: str = knob("auto", "auto: triton on CUDA; on CPU cpu when its kernel runs at the CPU's "
                                          "tier (make kernels builds it), else torch")
    overlap_scheduling: bool | str = knob(
        "auto", "do not schedule step N+1 while the device runs step N "
                "(default: overlap on CUDA, where the device runs asynchronously)", flag="--no-overlap")
    max_queue_delay: float | None = knob(
        None, "sjf/fair: seconds after which a waiting request goes first (aging)")
    tenant_weights: dict[str, float] | None = knob(None, "fair: share per user (default 1 each)", cli=False)
    admission: str = knob("on-demand", "on-demand (vLLM), reserve prompt+max_tokens (TGI), "
                                       "adaptive reservation (SGLang)")
    max_batch_total_tokens: int | None = knob(
        None, "reserve: tokens all running requests may reserve (default: the KV cache's capacity)")
    max_batch_prefill_tokens: int | None = knob(
        None, "reserve: prompt tokens per prefill step (default: max_num_batched_tokens)")
    waiting_served_ratio: float = knob(
        0.3, "reserve: waiting/running ratio that makes a prefill step worth pausing decodes")
    max_waiting_tokens: int = knob(20, "reserve: decode steps after which waiting requests are prefilled")
    adaptive_init_beta: float = knob(0.7, "adaptive: first guess of the used share of max_tokens")
    scheduling: str = knob("continuous", "static: batch-level static batching (ablation)",
                           choices=["continuous", "static"])
    kv_layout: str = knob("paged", "contiguous: each request reserves max_model_len up front (ablation)",
                          choices=["paged", "contiguous"])
    num_threads: int | None = knob(None, "CPU threads for torch (default: the cores this process may run on)")
    batch_invariant: bool = knob(
        False, "a request's tokens and logprobs are bitwise the same whatever else is scheduled with it (alone or "
               "in any batch, any chunking, prefix-cache hit or miss, preemption, speculation): every row reduced "
               "in an order fixed by its own position, at some cost in throughput (docs/batch_invariance.md); "
               "VLLM_BATCH_INVARIANT=1 turns it on too")
    structured_outputs_backend: str = knob(
        "auto", "the library that compiles structured-output constraints (auto = xgrammar)",
        choices=["auto", "xgrammar"], group="StructuredOutputsConfig", aliases=("--guided-decoding-backend",))

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if self.quantization is None:  # vLLM's spelling of "as the checkpoint says"
            object.__setattr__(self, "quantization", "auto")
        self._check_vllm_settings()
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N]; got {self.device!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy; got {self.load_format!r}")
        if self.load_quantized not in LOAD_QUANTIZED:
            raise ValueError(f"load_quantized must be one of {', '.join(LOAD_QUANTIZED)}; got {self.load_quantized!r}")
        if self.quantize_lm_head not in QUANTIZE_LM_HEAD:
            raise ValueError(f"quantize_lm_head must be one of {', '.join(QUANTIZE_LM_HEAD)}; "
                             f"got {self.quantize_lm_head!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {self.quantization!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1; got {self.max_model_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling must be continuous or static; got {self.scheduling!r}")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be paged or contiguous; got {self.kv_layout!r}")
        if self.max_queue_delay is not None and self.max_queue_delay <= 0:
            raise ValueError(f"max_queue_delay must be > 0 seconds; got {self.max_queue_delay}")
        if self.overlap_scheduling not in (True, False, "auto"):
            raise ValueError(f"overlap_scheduling must be True, False or 'auto'; got {self.overlap_scheduling!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1; got {self.num_threads}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1; got {self.tensor_parallel_size}")
        check_nodes(self)
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1; got {self.data_parallel_size}")
        if self.dp_routing not in DP_ROUTING_POLICIES:
            raise ValueError(f"dp_routing must be one of {', '.join(DP_ROUTING_POLICIES)}; got {self.dp_routing!r}")
        if self.data_parallel_size > 1 and self.nnodes > 1:
            raise ValueError("data parallelism runs on one machine: --data-parallel-size > 1 with --nnodes > 1 "
                             "is not supported")
        if self.cuda_graph_max_batch < 1:
            raise ValueError(f"cuda_graph_max_batch must be >= 1; got {self.cuda_graph_max_batch}")
        if self.structured_outputs_backend not in ("auto", "xgrammar"):
            raise ValueError("structured_outputs_backend must be auto or xgrammar; "
                             f"got {self.structured_outputs_backend!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}")
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory))
        check_kv_transfer(self)
        check_runner(self)
        check_lora(self)

    def _check_vllm_settings(self) -> None:
        """vLLM's settings: a value whose absence here would change results is an error naming what is
        missing (``only`` metadata); max_logprobs and hf_overrides are checked for shape."""
        for f in dataclasses.fields(self):
            if f.metadata.get("only") is None:
                continue
            allowed, feature = f.metadata["only"]
            value = getattr(self, f.name)
            if value != allowed:
                raise ValueError(f"{f.name}={value!r}: {feature} is not implemented yet; use {allowed!r}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (no limit) or >= 0; got {self.max_logprobs}")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise ValueError(f"hf_overrides must be a dict (JSON object); got {type(self.hf_overrides).__name__}")

    def ignored_settings(self, device: str | None = None) -> list[str]:
        """One warning line per vLLM setting given here that cannot change anything (never silent).

        ``device``: the device the engine resolved to (default: this config's own), so that the
        settings the user gave are judged, not those ``resolve`` derived (e.g. eager mode under TP)."""
        platform = platform_for(resolve_device(device or self.device))
        lines = []
        for f in dataclasses.fields(self):
            reason = f.metadata.get("no_effect")
            if reason and getattr(self, f.name) not in (f.default, None, False):
                flag = "--" + f.name.replace("_", "-")
                lines.append(f"{NO_EFFECT}: {flag}={getattr(self, f.name)} ({reason})")
        if self.enforce_eager and not platform.captures_graphs:
            lines.append(f"{NO_EFFECT}: --enforce-eager on {platform.name} (CUDA graphs are CUDA-only)")
        if self.gpu_memory_utilization != _default("gpu_memory_utilization") and not platform.profiles_memory:
            lines.append(f"{NO_EFFECT}: --gpu-memory-utilization on {platform.name} (--kv-cache-memory "
                         "sizes the KV cache there)")
        return lines

    def resolve(self) -> EngineConfig:
        """This config with every ``auto`` decided for this machine (config_resolve.py: the one place that
        decides)."""
        return resolve_config(self)

    @property
    def ranks_per_node(self) -> int:
        """Tensor-parallel ranks on each machine; global rank = node_rank * ranks_per_node + local rank."""
        return self.tensor_parallel_size // self.nnodes

    @property
    def threads_per_rank(self) -> int:
        """CPU threads for torch in each rank's process: the cores shared evenly between this machine's ranks."""
        return max(1, (self.num_threads or usable_cores()) // self.ranks_per_node)

    @property
    def threads_per_replica(self) -> int:
        """CPU threads for each data-parallel replica (its TP ranks share them): the cores split evenly."""
        return max(1, (self.num_threads or usable_cores()) // self.data_parallel_size)

    @property
    def torch_device(self) -> torch.device:
        """The resolved device as a torch.device."""
        return torch.device(self.resolve().device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The resolved dtype as a torch.dtype (ValueError for float16 on CPU)."""
        return _DTYPES[self.resolve().dtype]


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(EngineConfig) if f.name == name)
