// Helpers the portable CPU kernels share (attention.cpp, fused_ops.cpp): their per-level builds, bf16
// widening, a lane-split dot product, an exp the compiler vectorizes and one written with AVX-512.
//
// Everything here has internal linkage (an unnamed namespace): each file compiles its own copy under its
// own floating-point flags (csrc/build.py forbids FMA contraction in fused_ops.cpp only).
#pragma once

#include "isa.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

// A portable kernel's entry point NAME params, compiled for both x86-64 levels the library runs at
// (NAME_v4: AVX-512, NAME_v3: AVX2 + FMA) and called at the one the current tier allows; body calls the
// kernel's inline loops, which are compiled (and vectorized) anew inside each.
#define FOLO_PER_LEVEL(name, params, args, body)                            \
  FOLO_TARGET_V4 void name##_v4 params { body; }                            \
  FOLO_TARGET_V3 void name##_v3 params { body; }                            \
  void name params {                                                        \
    if (::folovllm::cpu::tier_at_least(::folovllm::cpu::Tier::kAvx512)) {   \
      name##_v4 args;                                                       \
    } else {                                                                \
      TORCH_CHECK(::folovllm::cpu::tier_at_least(::folovllm::cpu::Tier::kAvx2), \
                  #name " needs the avx2 tier at least");                   \
      name##_v3 args;                                                       \
    }                                                                       \
  }

namespace folovllm::cpu {
namespace {

constexpr int kLanes = 16;  // independent partial sums: the compiler maps them onto one vector register

// bf16 -> fp32 is exact: the 16 bits are fp32's upper half.
FOLO_INLINE float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

FOLO_INLINE float to_float(float x) { return x; }
FOLO_INLINE float to_float(c10::BFloat16 x) { return bf16_to_float(x.x); }

// sum of a[d] * b[d] in kLanes partial sums folded pairwise: a fixed order the compiler vectorizes.
FOLO_INLINE float lane_dot(const float* a, const float* b, int64_t n) {
  float part[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += a[d + j] * b[d + j];
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) part[j] += part[j + width];
  return part[0] + tail;
}

// exp(x), Cephes-style: a polynomial the compiler vectorizes, unlike libm's expf; ~1 ulp, and exactly 0
// below exp's float range.
FOLO_INLINE float fast_exp(float x) {
  const float v = std::min(std::max(x, -87.0f), 88.0f);
  const float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest integer
  const float r = v - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : y * scale;
}

// exp of 16 lanes of attention scores minus their row max (x <= 0), with AVX-512 (call it from
// functions that target it): fast_exp's polynomial, scaled by 2^k with vscalefps; lanes below -87
// give exp(-87) rather than 0, which a softmax's sums cannot tell apart.
FOLO_TARGET_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, k);
}

}  // namespace
}  // namespace folovllm::cpu
