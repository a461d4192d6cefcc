"""vLLM's process under a CPU tier cap sees the CPU features of a host of that tier.

vLLM picks its own kernels by torch's CPU feature probes (``torch.cpu._is_avx512_supported`` and its
kin): the build of its C++ library it loads (``_C_AVX2`` on an AVX2 host), its attention's instruction set,
its AMX paths. Torch's own caps (ATEN_CPU_CAPABILITY and the rest) do not reach those probes, so on an
AVX-512 host a "capped" vLLM would still run its AVX-512 attention. The coordinator puts this folder first
on the path of vLLM's processes with ``VS_VLLM_TIER`` set to the cap; Python imports this module as it
starts (every process, spawned workers too), and the probes then answer as on a host of that tier.
"""
import os

# the probes a tier passes: its own feature and those below it
_PASSES = {"avx2": set(), "avx512": {"avx512"}, "avx512_bf16": {"avx512", "avx512_bf16"},
           "amx": {"avx512", "avx512_bf16", "amx_tile"}}

_tier = os.environ.get("VS_VLLM_TIER")
if _tier:
    if _tier not in _PASSES:
        raise SystemExit(f"VS_VLLM_TIER must be one of {', '.join(_PASSES)}; got {_tier!r}")
    import torch.cpu

    for _feature in ("avx512", "avx512_bf16", "amx_tile"):
        _probe = getattr(torch.cpu, f"_is_{_feature}_supported")
        _answer = _probe() and _feature in _PASSES[_tier]
        setattr(torch.cpu, f"_is_{_feature}_supported", lambda answer=_answer: answer)
