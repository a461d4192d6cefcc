"""Every ``FOLOVLLM_*`` environment variable, declared once: its values, its default and what it does.

One of vLLM's variables is honoured and declared here too (``VLLM_BATCH_INVARIANT``). Nothing else in the
package reads ``os.environ`` for these names: code asks ``envs.value(NAME)`` (or
``envs.switch(NAME)`` for an on/off one), which checks the value against the declaration, so a typo is
an error naming the allowed values rather than a silently ignored setting. They are read when an engine
is built, never during a step, so two engines in one process may differ (the bench's A/B runs set one
before building each). ``folovllm --help-env`` prints this table.

The engine's settings (vLLM's flags) live in ``EngineConfig``; these are the platform's own switches:
which CPU tier and kernels to use, each with an off-path that tests compare against.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

ON_OFF = ("on", "off")


@dataclass(frozen=True)
class EnvVar:
    """One variable: ``choices`` None takes any text; ``default`` None means unset (the help says what that does)."""

    name: str
    default: str | None
    help: str
    choices: tuple[str, ...] | None = None


VARIABLES: dict[str, EnvVar] = {v.name: v for v in (
    # -- the CPU platform ---------------------------------------------------------------------------
    EnvVar("FOLOVLLM_CPU_ISA", None,
           "caps the CPU tier the engine uses (as ONEDNN_MAX_CPU_ISA caps oneDNN): none runs plain torch "
           "everywhere (what Arm and unknown CPUs get); unset: the tier this CPU has. Set before the process "
           "first runs a torch kernel to cap torch's own kernels too",
           ("none", "avx2", "avx512", "avx512_bf16", "amx")),
    EnvVar("FOLOVLLM_CPU_LINEAR", "auto",
           "unquantized linear layers on the CPU: folovllm (our kernel, where the tier has it for the dtype), "
           "onednn (weights prepacked for oneDNN), torch (plain F.linear); auto: folovllm where it runs, else "
           "onednn where oneDNN takes the dtype, else torch",
           ("auto", "folovllm", "onednn", "torch")),
    EnvVar("FOLOVLLM_CPU_FUSED_OPS", "on",
           "residual add + RMSNorm, q/k norm + rotary + KV-cache store and SiLU-mul as fused kernel ops "
           "(off: their torch forms)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_DECODER", "team",
           "how far the CPU platform compiles the decoder layers: modules (nn.Module calls), direct (the "
           "layers' ops called from Python), chain (a decode step's layers in one C++ call), team (the chain, "
           "and a small decode step's matmuls split over one team of threads)",
           ("modules", "direct", "chain", "team")),
    EnvVar("FOLOVLLM_CPU_GREEDY_HEAD", "on",
           "a step whose rows are all plain greedy takes each row's argmax inside the LM head's matmul, the "
           "logits never written (off: logits, then the sampler)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_PREFILL_ATTENTION", "kernel",
           "fresh prompt chunks: our causal prefill kernel where the tier has it (kernel) or torch's SDPA (sdpa)",
           ("kernel", "sdpa")),
    EnvVar("FOLOVLLM_CPU_ATTENTION_FAST_DECODE", "on",
           "decode rows of the CPU attention kernel take its AVX-512 form (head_dim 32, 64 or 128) or its per-tier "
           "form (below avx512, or other head_dims of whole AVX2 vectors) (off: the kernel's portable path)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_ATTENTION_BF16_DOT", "on",
           "the CPU attention kernel scores bf16 keys with bf16 dot products at the avx512_bf16 tier (off: keys "
           "widened to fp32 first)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_ATTENTION_PREFETCH", "on",
           "the CPU attention kernel's decode rows prefetch the next tile's K/V rows while a tile computes (the "
           "same bits either way)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_ATTENTION_CHUNKED_CLAIMS", "on",
           "the CPU attention kernel's threads claim runs of work items rather than one at a time (the same bits "
           "either way)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_LINEAR_CLAIMS", "on",
           "the linear kernels' threads (and the greedy head's) claim runs of work items as they go, so one that "
           "started late or lost its core a while takes fewer (off: a fixed share each, as torch's parallel_for "
           "splits; the same bits either way)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_TOP_K_KERNEL", "on",
           "rows sampled among their top k logits find them with our kernel: one pass per row, the lower token id "
           "first among equal logits (off: torch.topk, whose order among equal logits is its own)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_LORA_KERNEL", "on",
           "LoRA adapters' deltas through our kernel, one call per linear for every adapter in the step, in "
           "fp32 (off: torch matmuls per adapter and piece, in the platform's small-matmul dtype)", ON_OFF),
    EnvVar("FOLOVLLM_CPU_ALLOCATOR", "auto",
           "the folovllm command's memory allocator: tcmalloc (restarts the command once with it preloaded; "
           "an error where none is installed), system (glibc's malloc); auto: tcmalloc where one is installed "
           "and the machine has no NVIDIA GPU. An engine in one's own Python program keeps its process's",
           ("auto", "tcmalloc", "system")),
    EnvVar("FOLOVLLM_HUGE_PAGE_WEIGHTS", "on",
           "after loading on the CPU, the weights are copied into one block advised onto 2 MiB pages "
           "(fewer TLB misses when a decode step streams them)", ON_OFF),
    # -- the engine's host work per step -----------------------------------------------------------
    EnvVar("FOLOVLLM_DECODE_ROWS", "on",
           "the worker keeps each decoding request's block table and sampling settings, so a decode step sends "
           "only its id, token, position and new blocks, and the batch and its sampling tensors are built in "
           "bulk from what it keeps (off: every request in full every step, the batch built row by row)", ON_OFF),
    EnvVar("FOLOVLLM_BULK_DECODES", "on",
           "the scheduler takes the running requests that each compute just their next token in one pass (no "
           "allocation call for one whose blocks hold it) and counts the step's decode rows as it goes; the step's "
           "input takes them as decode rows without a look at each (off: each request through the general path, "
           "the step's cost terms from every request)", ON_OFF),
    EnvVar("FOLOVLLM_BATCHED_OUTPUTS", "on",
           "a step's sampled tokens that need no logprobs, grammar or stop strings are appended in one pass, "
           "screened for stop tokens as one array and detokenized in one pass (off: each token through the "
           "output processor in turn)", ON_OFF),
    EnvVar("FOLOVLLM_TOP_K_CANDIDATES", "on",
           "a step whose random rows all have a top_k samples each row among its top k tokens (topk; no sort, "
           "softmax or noise over the whole vocabulary): the same distribution, but a tie at the k-th logit keeps k "
           "tokens, and a seeded request's noise for a token is hashed from its seed, output count and the token's "
           "id, the key of the counter-keyed draw that a platform with one (CUDA) uses instead of this path (off: "
           "the vocabulary sorted, every token tied with the k-th kept, a seeded request's noise drawn from its "
           "generator for every token)", ON_OFF),
    # -- the CUDA platform ---------------------------------------------------------------------------
    EnvVar("FOLOVLLM_CUDA_FUSED_OPS", "on",
           "residual add + RMSNorm, q/k norm + rotary + KV-cache store and SiLU-mul as Triton kernels on CUDA "
           "(off: their torch forms)", ON_OFF),
    EnvVar("FOLOVLLM_CUDA_GRAPH_SAMPLING", "on",
           "decode steps with sampled rows (temperature, top-k, top-p, min-p, seeds) sample inside their CUDA "
           "graph, as all-greedy steps take their argmax there (off: such steps run eagerly; the tokens are the "
           "same)", ON_OFF),
    EnvVar("FOLOVLLM_TRITON_SPLIT_DECODE", "on",
           "the triton attention backend's decode steps split each sequence's context over several programs, "
           "then reduce (flash-decoding), so a few long sequences fill the GPU (off: one program per sequence "
           "and KV head)", ON_OFF),
    # -- quantized linears --------------------------------------------------------------------------
    EnvVar("FOLOVLLM_QUANT_KERNEL", "auto",
           "int4/int8 matmuls: folovllm (ours; an error where the tier lacks it), torch (torch's CPU "
           "kernels), reference (dequantize, then one fp32 matmul: slow and plainly right); auto: ours where "
           "the tier has it, else torch's",
           ("auto", "folovllm", "torch", "reference")),
    EnvVar("FOLOVLLM_INT4_ACTIVATIONS", "bf16",
           "our int4 matmul multiplies bf16 activations as they come (bf16) or rounds them to int8 per row "
           "and group for byte dot products (int8: AVX512_VNNI's, else AVX2's); auto: int8 from 16 rows on",
           ("bf16", "int8", "auto")),
    EnvVar("FOLOVLLM_CPU_GGUF_A8", "auto",
           "GGUF linears held packed round their rows' activations to int8 per 256 inputs for their Q4_K and "
           "Q6_K parts, multiplied in AVX512_VNNI byte dot products (bf16 rows, VNNI CPUs at avx512_bf16 and "
           "up): on at any rows, auto from 2 rows a call (one row reads weights: no faster), off never (bf16 "
           "dot products, as for every other type)", ("auto", "on", "off")),
    EnvVar("FOLOVLLM_GGUF_FAST_LOAD", "on",
           "a GGUF file's metadata is read through plain array views of its mapping (gguf's reader slices its "
           "memmap once per vocabulary entry), and its blocks are repacked for our kernel by our C++ op, threaded "
           "over column blocks, where the kernel library is loaded (off: gguf's reader as it is, numpy's "
           "pack_gguf; the same fields and bytes, an 8B Q4_K_M file's load several times slower)", ON_OFF),
    # -- files and serving --------------------------------------------------------------------------
    EnvVar("FOLOVLLM_CACHE_ROOT", None,
           "where FoloVLLM keeps what it derives from models (converted GGUF tokenizers); unset: "
           "~/.cache/folovllm"),
    EnvVar("FOLOVLLM_TOKENIZER_CACHE", "on",
           "a GGUF file's tokenizer is converted once and kept under the cache root (off: converted at every "
           "start)", ON_OFF),
    EnvVar("FOLOVLLM_API_KEY", None, "serve: the key clients must send (--api-key overrides it); unset: none"),
    # -- vLLM's names -------------------------------------------------------------------------------
    EnvVar("VLLM_BATCH_INVARIANT", "0",
           "1: every engine runs batch-invariant, as with --batch-invariant (vLLM's switch for it); 0: as the "
           "engine's own setting says", ("0", "1")),
)}


def value(name: str) -> str | None:
    """The variable's value (its default when unset); ValueError for an undeclared name or a value it
    does not take."""
    var = VARIABLES.get(name)
    if var is None:
        raise ValueError(f"{name} is not a FoloVLLM environment variable; see `folovllm --help-env`")
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return var.default
    if var.choices is not None and raw not in var.choices:
        raise ValueError(f"{name}={raw!r}; choose one of {', '.join(var.choices)}")
    return raw


@contextmanager
def overridden(values: Mapping[str, str]) -> Iterator[None]:
    """These variables set for the block (an engine built inside reads them and checks them), as they were
    after it."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in previous.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def switch(name: str) -> bool:
    """An on/off variable as a bool."""
    if VARIABLES[name].choices != ON_OFF:
        raise ValueError(f"{name} is not an on/off switch")
    return value(name) == "on"


# what a FOLOVLLM_CPU_ISA cap sets torch's own variables to: ATen's vector width, oneDNN's instruction set,
# MKL's (torch's fp32 matmul on an Intel CPU: capped by neither of the other two, it would run AVX-512 under
# an AVX2 cap); none leaves torch's kernels as they are: that tier means none of ours, as on Arm
_TORCH_CAPS = {"avx2": ("avx2", "AVX2", "AVX2"), "avx512": ("avx512", "AVX512_CORE", "AVX512"),
               "avx512_bf16": ("avx512", "AVX512_CORE_BF16", "AVX512_E3"),
               "amx": ("avx512", "AVX512_CORE_AMX", "AVX512_E4")}


def torch_caps(tier: str | None) -> dict[str, str]:
    """The variables that cap torch's own kernels at a CPU tier (``ATEN_CPU_CAPABILITY``,
    ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``); none for no tier or ``none``."""
    if tier not in _TORCH_CAPS:
        return {}
    aten, onednn, mkl = _TORCH_CAPS[tier]
    return {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn, "MKL_ENABLE_INSTRUCTIONS": mkl}


def cap_torch_kernels() -> None:
    """Passes a ``FOLOVLLM_CPU_ISA`` cap on to torch's kernels (``torch_caps``) unless those variables are set.
    Torch reads both when it first runs such a kernel, so this works only before that: the package calls it
    as it is imported. A cap above the CPU's own tier changes nothing (both are maxima)."""
    for name, cap in torch_caps(value("FOLOVLLM_CPU_ISA")).items():
        os.environ.setdefault(name, cap)


def describe() -> str:
    """The table as text: name, values, default, help (``folovllm --help-env``, docs/environment.md)."""
    lines = ["| variable | values | default | what it does |", "|---|---|---|---|"]
    for var in VARIABLES.values():
        values = " \\| ".join(var.choices) if var.choices else "text"
        default = "unset" if var.default is None else var.default
        lines.append(f"| `{var.name}` | {values} | {default} | {var.help} |")
    return "\n".join(lines)
