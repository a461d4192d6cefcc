// The current tier of the kernel library (isa.h): the CPU's own, capped by folovllm/platforms/isa.py; and the
// kernels' switches.
#include "isa.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace folovllm::cpu {

namespace {

Tier detect() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("x86-64-v3")) return Tier::kNone;
  if (!__builtin_cpu_supports("x86-64-v4")) return Tier::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return Tier::kAvx512;
  return __builtin_cpu_supports("amx-bf16") ? Tier::kAmx : Tier::kAvx512Bf16;
}

std::atomic<int> current{static_cast<int>(host_tier())};

// KernelSwitches as bits, so that a call reads them all at once while a test may set them.
constexpr unsigned kFastDecode = 1, kBf16Dot = 2, kPrefetch = 4, kChunkedClaims = 8, kLinearClaims = 16;
std::atomic<unsigned> switch_bits{kFastDecode | kBf16Dot | kPrefetch | kChunkedClaims | kLinearClaims};

}  // namespace

Tier host_tier() {
  static const Tier host = detect();
  return host;
}

bool host_has_vnni() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return vnni;
}

Tier tier() { return static_cast<Tier>(current.load(std::memory_order_relaxed)); }

void set_tier(Tier t) {
  TORCH_CHECK(static_cast<int>(t) <= static_cast<int>(host_tier()), "this CPU's tier is ", tier_name(host_tier()),
              "; it cannot run ", tier_name(t), " kernels");
  current.store(static_cast<int>(t), std::memory_order_relaxed);
}

std::string tier_name(Tier t) {
  switch (t) {
    case Tier::kNone: return "none";
    case Tier::kAvx2: return "avx2";
    case Tier::kAvx512: return "avx512";
    case Tier::kAvx512Bf16: return "avx512_bf16";
    case Tier::kAmx: return "amx";
  }
  return "none";
}

Tier tier_from_name(const std::string& name) {
  for (Tier t : {Tier::kNone, Tier::kAvx2, Tier::kAvx512, Tier::kAvx512Bf16, Tier::kAmx})
    if (tier_name(t) == name) return t;
  TORCH_CHECK(false, "unknown CPU tier '", name, "': use none, avx2, avx512, avx512_bf16 or amx");
}

void set_kernel_switches(const KernelSwitches& s) {
  switch_bits = (s.fast_decode ? kFastDecode : 0) | (s.bf16_dot ? kBf16Dot : 0) | (s.prefetch ? kPrefetch : 0) |
                (s.chunked_claims ? kChunkedClaims : 0) | (s.linear_claims ? kLinearClaims : 0);
}

KernelSwitches kernel_switches() {
  const unsigned bits = switch_bits;
  return {.fast_decode = (bits & kFastDecode) != 0, .bf16_dot = (bits & kBf16Dot) != 0,
          .prefetch = (bits & kPrefetch) != 0, .chunked_claims = (bits & kChunkedClaims) != 0,
          .linear_claims = (bits & kLinearClaims) != 0};
}

}  // namespace folovllm::cpu
