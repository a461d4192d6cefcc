// Helpers the CPU kernels share (cpu_attention.cpp, cpu_fused_ops.cpp): per-instruction-set builds,
// bf16 widening, a lane-split dot product, an exp the compiler vectorizes and one written with AVX-512.
//
// Everything here has internal linkage (an unnamed namespace): each library compiles its own copy under
// its own floating-point flags (csrc/build.py forbids FMA contraction in cpu_fused_ops.cpp only).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FOLO_HAS_EXP16 1
#endif

// One compiled copy per instruction set, picked at load time: one binary, correct on any x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FOLO_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FOLO_MULTIVERSION
#endif
#define FOLO_INLINE inline __attribute__((always_inline))

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

#ifdef FOLO_HAS_EXP16
// exp of 16 lanes of attention scores minus their row max (x <= 0), with AVX-512 (call it from
// functions that target it): fast_exp's polynomial, scaled by 2^k with vscalefps; lanes below -87
// give exp(-87) rather than 0, which a softmax's sums cannot tell apart.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
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
#endif

}  // namespace
