// The vector type the per-tier kernels (csrc/cpu/tiered/) are written against, one implementation per tier.
//
// A tiered source is compiled once per tier (csrc/build.py: -march=x86-64-v3 for avx2, x86-64-v4 for
// avx512) with FOLO_TIER naming the tier; this header then picks the matching implementation, and
// everything here lives in that tier's namespace (folovllm::cpu::avx2, folovllm::cpu::avx512), so the
// copies built for different tiers never meet at link time. A kernel says `Vec` and `kLanes` and is written
// once.
//
// Vec holds kLanes fp32 lanes (8: AVX2's ymm, 16: AVX-512's zmm). The bf16 helpers read a packed bf16 pair
// per 32-bit lane, as the linear kernel's weights hold them (pair = w[k] | w[k + 1] << 16): `even` is each
// lane's w[k] as fp32, `odd` its w[k + 1] (bf16 is fp32's upper half, so both are exact).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if !defined(FOLO_TIER)
#error "a tiered source is built with FOLO_TIER set (csrc/build.py compile SOURCE OBJECT TIER)"
#endif

#define FOLO_VINLINE inline __attribute__((always_inline))

namespace folovllm::cpu::FOLO_TIER {

#if defined(__AVX512F__)

constexpr int kLanes = 16;
using Vec = __m512;
using VecI = __m512i;

FOLO_VINLINE Vec vzero() { return _mm512_setzero_ps(); }
FOLO_VINLINE Vec vload(const float* p) { return _mm512_loadu_ps(p); }
FOLO_VINLINE void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
FOLO_VINLINE Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
FOLO_VINLINE Vec vset1(float x) { return _mm512_set1_ps(x); }
FOLO_VINLINE Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
FOLO_VINLINE Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
FOLO_VINLINE Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
FOLO_VINLINE Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
FOLO_VINLINE Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
FOLO_VINLINE Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
FOLO_VINLINE Vec vfnma(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
FOLO_VINLINE Vec vround(Vec v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// v 2^k for integral k in exp's range
FOLO_VINLINE Vec vscale2(Vec v, Vec k) { return _mm512_scalef_ps(v, k); }
// where a < b: 0, else v
FOLO_VINLINE Vec vzero_below(Vec v, Vec a, Vec b) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_NLT_UQ), v);
}
FOLO_VINLINE VecI vload_i(const void* p) { return _mm512_loadu_si512(p); }
FOLO_VINLINE Vec bf16_even(VecI pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
FOLO_VINLINE Vec bf16_odd(VecI pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
// kLanes bf16 -> fp32
FOLO_VINLINE Vec vload_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
// kLanes int8 -> fp32
FOLO_VINLINE Vec vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// kLanes one-byte floats (sign, then the rest) -> fp32 bits: sign to bit 31, the rest shifted up by `shift`
FOLO_VINLINE Vec vload_byte_float(const uint8_t* p, int shift) {
  const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i magnitude = _mm512_sll_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(0x7f)), _mm_cvtsi32_si128(shift));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(magnitude, sign));
}
// fp32 -> bf16, rounded to nearest even as torch's cast does (NaN aside: a kernel's sums make none)
FOLO_VINLINE void vstore_bf16(uint16_t* p, Vec v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}
// The sums of a, b, c, d's lanes, in that order, into out[0..4).
FOLO_VINLINE void vsum4(Vec a, Vec b, Vec c, Vec d, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lanes), _mm512_extractf32x8_ps(lanes, 1));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1)));
}
FOLO_VINLINE float vhsum(Vec v) { return _mm512_reduce_add_ps(v); }
FOLO_VINLINE float vhmax(Vec v) { return _mm512_reduce_max_ps(v); }
// fp32 -> bf16 -> fp32 (what storing a bf16 output and reading it back gives), in registers
FOLO_VINLINE Vec vround_bf16(Vec v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

#elif defined(__AVX2__) && defined(__FMA__)

constexpr int kLanes = 8;
using Vec = __m256;
using VecI = __m256i;

FOLO_VINLINE Vec vzero() { return _mm256_setzero_ps(); }
FOLO_VINLINE Vec vload(const float* p) { return _mm256_loadu_ps(p); }
FOLO_VINLINE void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
FOLO_VINLINE Vec vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
FOLO_VINLINE Vec vset1(float x) { return _mm256_set1_ps(x); }
FOLO_VINLINE Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
FOLO_VINLINE Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
FOLO_VINLINE Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
FOLO_VINLINE Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
FOLO_VINLINE Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
FOLO_VINLINE Vec vdiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
FOLO_VINLINE Vec vfnma(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
FOLO_VINLINE Vec vround(Vec v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
FOLO_VINLINE Vec vscale2(Vec v, Vec k) {  // k + 127 in the exponent field: 2^k for k in [-126, 127]
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(v, _mm256_castsi256_ps(bits));
}
FOLO_VINLINE Vec vzero_below(Vec v, Vec a, Vec b) { return _mm256_and_ps(v, _mm256_cmp_ps(a, b, _CMP_NLT_UQ)); }
FOLO_VINLINE VecI vload_i(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
FOLO_VINLINE Vec bf16_even(VecI pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
FOLO_VINLINE Vec bf16_odd(VecI pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
FOLO_VINLINE Vec vload_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
FOLO_VINLINE Vec vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
FOLO_VINLINE Vec vload_byte_float(const uint8_t* p, int shift) {
  const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i magnitude = _mm256_sll_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x7f)), _mm_cvtsi32_si128(shift));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x80)), 24);
  return _mm256_castsi256_ps(_mm256_or_si256(magnitude, sign));
}
FOLO_VINLINE void vstore_bf16(uint16_t* p, Vec v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  // 8 x 32-bit -> 8 x 16-bit: pack within 128-bit halves, then gather the halves' low quadwords
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
FOLO_VINLINE void vsum4(Vec a, Vec b, Vec c, Vec d, float* out) {
  // hadd twice: [a, b, c, d] sums of each 128-bit half, then the halves added
  const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
}
FOLO_VINLINE float vhsum(Vec v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
FOLO_VINLINE float vhmax(Vec v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
FOLO_VINLINE Vec vround_bf16(Vec v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

#else
#error "vec.h has an implementation for avx2 (x86-64-v3) and avx512 (x86-64-v4) builds only"
#endif

// One bf16 (its bits) as fp32, exact: a tail shorter than a vector, a scalar read.
FOLO_VINLINE float bf16_scalar(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// The lanes of v as floats (a tail, an argmax's block), in order.
FOLO_VINLINE void vspill(float* out, Vec v) { vstore(out, v); }

// exp(x) per lane, Cephes-style: x = k ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial in r, times 2^k;
// within 2 ulp of expf, exactly 0 below exp's float range (x < -87) and finite at its top (x clamped to 88).
FOLO_VINLINE Vec vexp(Vec x) {
  const Vec v = vmin(vmax(x, vset1(-87.0f)), vset1(88.0f));
  const Vec k = vround(vmul(v, vset1(1.44269504088896341f)));
  Vec r = vfnma(k, vset1(0.693359375f), v);
  r = vfnma(k, vset1(-2.12194440e-4f), r);
  Vec y = vset1(1.9875691500e-4f);
  y = vfma(y, r, vset1(1.3981999507e-3f));
  y = vfma(y, r, vset1(8.3334519073e-3f));
  y = vfma(y, r, vset1(4.1665795894e-2f));
  y = vfma(y, r, vset1(1.6666665459e-1f));
  y = vfma(y, r, vset1(5.0000001201e-1f));
  y = vfma(vmul(y, r), r, vadd(r, vset1(1.0f)));
  return vzero_below(vscale2(y, k), x, vset1(-87.0f));
}

}  // namespace folovllm::cpu::FOLO_TIER
