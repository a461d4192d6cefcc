// The instruction-set tiers of the CPU kernel library, and the one place that says which tier runs and which
// of the kernels' switchable optimizations are on.
//
// The library is built once for every x86-64 CPU: each kernel that needs more than the baseline is
// compiled for its tier with a target attribute (the macros below, defined nowhere else) and called only
// when the current tier allows it. The current tier starts as the CPU's own (host_tier) and is lowered
// by folovllm/platforms/isa.py to the FOLOVLLM_CPU_ISA cap (set_tier), so any host runs and tests every
// lower tier's code. AMX hosts run the AVX-512 BF16 kernels, and the bf16 linear's AMX form (linear_amx.h).
#pragma once

#include <cstdint>
#include <string>

#if !defined(__x86_64__) || !defined(__GNUC__)
#error "the FoloVLLM CPU kernel library is built for x86-64 with GCC; other CPUs run the plain torch tier"
#endif

#include <immintrin.h>

// The portable kernels (plain C++ the compiler vectorizes) compiled for the x86-64 levels: v3 is AVX2 + FMA
// (+ F16C, BMI), the tier of most laptops, desktops and cloud VMs since ~2015; v4 adds AVX-512 F/BW/VL/DQ/CD.
#define FOLO_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#define FOLO_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
// Kernels written with intrinsics: AVX2 + FMA + F16C.
#define FOLO_ISA_AVX2 "avx2,fma,f16c"
// AVX-512 F/BW/VL/DQ (Skylake-SP and later servers, Zen 4).
#define FOLO_ISA_AVX512 "avx512f,avx512bw,avx512vl,avx512dq"
// AVX-512 with its bf16 dot products (vdpbf16ps): Cooper Lake, Sapphire Rapids and later, Zen 4.
#define FOLO_ISA_AVX512_BF16 FOLO_ISA_AVX512 ",avx512bf16"
// The same plus AVX512_VNNI's byte dot products (vpdpbusd).
#define FOLO_ISA_AVX512_VNNI FOLO_ISA_AVX512_BF16 ",avx512vnni"
#define FOLO_TARGET_AVX2 __attribute__((target(FOLO_ISA_AVX2)))
#define FOLO_TARGET_AVX512 __attribute__((target(FOLO_ISA_AVX512)))
#define FOLO_TARGET_AVX512_BF16 __attribute__((target(FOLO_ISA_AVX512_BF16)))
#define FOLO_TARGET_AVX512_VNNI __attribute__((target(FOLO_ISA_AVX512_VNNI)))
// The AVX-512 BF16 set plus the AMX tile unit and its bf16 dot products (Sapphire Rapids and later).
#define FOLO_TARGET_AMX __attribute__((target(FOLO_ISA_AVX512_BF16 ",amx-tile,amx-bf16")))
// For lambdas inside such kernels (a lambda does not take its enclosing function's target).
#define FOLO_LAMBDA_AVX512_BF16 __attribute__((always_inline, target(FOLO_ISA_AVX512_BF16)))

#define FOLO_INLINE inline __attribute__((always_inline))

namespace folovllm::cpu {

// Ordered: a tier includes every lower one.
enum class Tier : int { kNone = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

// The tier this CPU has (detected once).
Tier host_tier();
// Whether this CPU has AVX512_VNNI (the int8-activation int4 kernel needs it beside the AVX-512 BF16 tier).
bool host_has_vnni();
// The tier the kernels run at now: the host's, or lower once set_tier capped it.
Tier tier();
// Caps the tier; an error for a tier this CPU lacks.
void set_tier(Tier t);

FOLO_INLINE bool tier_at_least(Tier floor) { return static_cast<int>(tier()) >= static_cast<int>(floor); }

std::string tier_name(Tier t);
Tier tier_from_name(const std::string& name);

// The kernels' optimizations that have an off-path to compare against: process-wide like the tier, set once
// from the environment (folovllm/platforms/kernel_library.py), never a per-call argument.
struct KernelSwitches {
  bool fast_decode = true;  // attention's decode rows take the AVX-512 / per-tier forms (off: the portable path)
  bool bf16_dot = true;  // attention scores bf16 keys with bf16 dot products at avx512_bf16 (off: widened to fp32)
  bool prefetch = true;  // attention prefetches the next tile's K/V rows while a tile computes (the same bits)
  bool chunked_claims = true;  // attention's threads claim runs of work items, not one at a time (the same bits)
  bool linear_claims = true;  // the linears' threads claim runs of work items as they go, not a fixed share each
                              // (the same bits)
};
void set_kernel_switches(const KernelSwitches& switches);
KernelSwitches kernel_switches();

}  // namespace folovllm::cpu
