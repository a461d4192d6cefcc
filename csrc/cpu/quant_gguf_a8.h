// gguf_gemm_a8's Q4_K and Q6_K parts: the activations rounded to int8, one scale per row and super-block of
// 256 inputs, so the codes meet them in AVX512_VNNI's byte dot products (vpdpbusd: 64 products an
// instruction) instead of being turned into bf16 first (quant_gguf.h: a shift, a ternary-logic op and a
// bf16 dot product per 32 codes; here an AND, half a shift and one vpdpbusd).
//
// Over a super-block, with x_k ~ d a_k (a_k int8, d = max |x_k| / 127 over the 256 inputs) and, in sub-block
// j of 32 inputs, w = D sc_j q - Dmin m_j (D, Dmin the file's fp16 scales, sc_j and m_j its six-bit integers):
//   sum_k x_k w_k ~ D d sum_j sc_j (sum_{k in j} a_k q_k) - Dmin d sum_j m_j (sum_{k in j} a_k),
// every inner sum exact in int32 (|a q| sums stay under 2^25), so each super-block takes two int-to-float
// conversions per output, not one scale per sub-block. The sums of a per sub-block are taken once per row.
//
// The codes lie as quant_int4.h has them (gguf_layout.h): a lane's low nibbles are codes 0 4 1 5 of its
// chunk of 8, its high nibbles 2 6 3 7; the activations are stored in that order per chunk, so each masked
// nibble set meets 4 of them.
#pragma once

#include "quant_gguf.h"

#include <type_traits>

namespace folovllm::cpu {
namespace {

constexpr int64_t kA8SuperK = 256;  // inputs per activation scale (a K-type super-block)
constexpr int64_t kA8SubK = 32;     // inputs per Q4_K sub-block
constexpr int64_t kA8SumK = 16;     // inputs per activation sum (a Q6_K sub-block; a Q4_K one takes two)

// Rows x [M, K] rounded to int8: a [M, K] in nibble order per chunk of 8, scale [M, K / 256] (d) and
// sum [M, K / 16] (each 16 inputs' sum of a).
struct GgufA8Rows {
  const int8_t* a;
  const float* scale;
  const int32_t* sum;
};

// The types gguf_gemm_a8 multiplies with int8 activations.
inline bool gguf_a8_type(int64_t type) {
  return static_cast<GgufType>(type) == GgufType::kQ4_K || static_cast<GgufType>(type) == GgufType::kQ6_K;
}

// Whether gguf_gemm_a8 takes int8 activations for M rows of w: a VNNI CPU, at least min_rows rows and a
// Q4_K or Q6_K part.
inline bool gguf_a8_takes(const GgufWeight& w, int64_t M, int64_t min_rows) {
  if (!cpu_supported() || !host_has_vnni() || M < std::max<int64_t>(min_rows, 1)) return false;
  for (const GgufPartView& part : w.parts)
    if (gguf_a8_type(part.type)) return true;
  return false;
}

FOLO_TARGET_AVX512_VNNI FOLO_INLINE float hmax16(__m512 v) { return _mm512_reduce_max_ps(v); }

// bf16 x [M, K] (K whole super-blocks) -> buffers (see GgufA8Rows), rounding to nearest.
FOLO_TARGET_AVX512_VNNI GgufA8Rows gguf_a8_quantize(const c10::BFloat16* x, int64_t M, int64_t K, A8Buffers& b) {
  b.a.resize(M * K);
  b.scale.resize(M * (K / kA8SuperK));
  b.sum.resize(M * (K / kA8SumK));
  const __m128i order = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t m = 0; m < M; ++m) {
    const c10::BFloat16* row = x + m * K;
    for (int64_t s = 0; s < K / kA8SuperK; ++s) {
      const int64_t k0 = s * kA8SuperK;
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = k0; k < k0 + kA8SuperK; k += 16) amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, load16(row + k)));
      const float d = hmax16(amax) / 127.f;
      const __m512 inv = _mm512_set1_ps(d > 0.f ? 1.f / d : 0.f);
      for (int64_t k = k0; k < k0 + kA8SuperK; k += kA8SumK) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(load16(row + k), inv));  // nearest, |q| <= 127
        _mm_storeu_si128(reinterpret_cast<__m128i*>(b.a.data() + m * K + k),
                         _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), order));
        b.sum[m * (K / kA8SumK) + k / kA8SumK] = _mm512_reduce_add_epi32(q);
      }
      b.scale[m * (K / kA8SuperK) + s] = d;
    }
  }
  return {b.a.data(), b.scale.data(), b.sum.data()};
}

// R rows x C column blocks of a Q4_K part over all of K (A accumulator chains per output vector).
template <int R, int C, int A, typename Out>
FOLO_TARGET_AVX512_VNNI void gguf_a8_tile(const GgufA8Rows& xa, int64_t K, const uint8_t* block, int64_t block_bytes,
                                          int64_t meta_area, Out y, int64_t N, const uint8_t* end) {
  constexpr int kSubs = static_cast<int>(kA8SuperK / kA8SubK);
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int32_t* aw = reinterpret_cast<const int32_t*>(xa.a);  // 4 activations per int32, 2 per chunk
  const int64_t a_stride = K / 4, scale_stride = K / kA8SuperK, sum_stride = K / kA8SumK;
  for (int64_t s = 0; s < K / kA8SuperK; ++s) {
    __m512i scaled[R][C];  // sum_j sc_j dot_j
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) scaled[r][c] = _mm512_setzero_si512();
    for (int j = 0; j < kSubs; ++j) {
      const int64_t g = s * kSubs + j;
      const uint8_t* at[C];
      for (int c = 0; c < C; ++c) {
        at[c] = block + c * block_bytes + meta_area + g * 256;
        for (int line = 0; line < 256; line += 64) prefetch_ahead(at[c] + line, end);
      }
      __m512i dot[A][R][C];
      for (int i = 0; i < A; ++i)
        for (int r = 0; r < R; ++r)
          for (int c = 0; c < C; ++c) dot[i][r][c] = _mm512_setzero_si512();
      for (int ch = 0; ch < 4; ++ch) {
        __m512i lo[C], hi[C];
        for (int c = 0; c < C; ++c) {
          const __m512i lanes = _mm512_loadu_si512(at[c] + 64 * ch);
          lo[c] = _mm512_and_si512(lanes, low);
          hi[c] = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low);
        }
        for (int r = 0; r < R; ++r) {
          const int32_t* ar = aw + r * a_stride + (g * 4 + ch) * 2;
          const __m512i alo = _mm512_set1_epi32(ar[0]), ahi = _mm512_set1_epi32(ar[1]);
          for (int c = 0; c < C; ++c) {
            dot[0][r][c] = _mm512_dpbusd_epi32(dot[0][r][c], lo[c], alo);
            dot[A - 1][r][c] = _mm512_dpbusd_epi32(dot[A - 1][r][c], hi[c], ahi);
          }
        }
      }
      for (int c = 0; c < C; ++c) {
        const uint8_t* sc = block + c * block_bytes + 320 * s + 64 + 16 * j;
        const __m512i sc32 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
        for (int r = 0; r < R; ++r) {
          const __m512i d = A == 1 ? dot[0][r][c] : _mm512_add_epi32(dot[0][r][c], dot[A - 1][r][c]);
          scaled[r][c] = _mm512_add_epi32(scaled[r][c], _mm512_mullo_epi32(d, sc32));
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const uint8_t* sb = block + c * block_bytes + 320 * s;
      __m512i mins[R];  // sum_j m_j (sum of a over sub-block j)
      for (int r = 0; r < R; ++r) mins[r] = _mm512_setzero_si512();
      for (int j = 0; j < kSubs; ++j) {
        const __m512i m32 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 192 + 16 * j)));
        for (int r = 0; r < R; ++r) {
          const int32_t* sums = xa.sum + r * sum_stride + 2 * (s * kSubs + j);
          mins[r] = _mm512_add_epi32(mins[r], _mm512_mullo_epi32(m32, _mm512_set1_epi32(sums[0] + sums[1])));
        }
      }
      const __m512 d = half16(sb), dmin = half16(sb + 32);
      for (int r = 0; r < R; ++r) {
        const __m512 da = _mm512_set1_ps(xa.scale[r * scale_stride + s]);
        out[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(scaled[r][c]), out[r][c]);
        out[r][c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(mins[r]), out[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) put(y, r, N, c * kBlockCols, out[r][c]);
}

// R rows x C column blocks of a Q6_K part over all of K. Over a super-block, with w = D sc_j (q - 32) in
// sub-block j of 16 inputs (D fp16, sc_j int8, q 0..63):
//   sum_k x_k w_k ~ D d sum_j sc_j (sum_{k in j} a_k q_k - 32 sum_{k in j} a_k),
// each sub-block's term under 2^24 in magnitude and 16 of them under 2^31: one conversion per super-block.
// A lane's 6-bit codes: its chunk's nibbles (as Q4_K's) and two high bits each from the group's high word
// (bits 2p and 16 + 2p of input pair p), set into bits 4-5 of the nibbles' bytes.
FOLO_TARGET_AVX512_VNNI FOLO_INLINE void gguf_a8_q6_codes(__m512i lanes, __m512i h, __m512i& lo, __m512i& hi) {
  const __m512i low = _mm512_set1_epi8(0x0F), near = _mm512_set1_epi32(0x00300030), far = _mm512_set1_epi32(0x30003000);
  lo = _mm512_and_si512(lanes, low);  // inputs 0 4 1 5 of the chunk
  hi = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low);  // inputs 2 6 3 7
  lo = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 4), near, lo, 0xEA);
  lo = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 8), far, lo, 0xEA);
  hi = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 2), near, hi, 0xEA);
  hi = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 6), far, hi, 0xEA);
}

template <int R, int C, typename Out>
FOLO_TARGET_AVX512_VNNI void gguf_a8_q6_tile(const GgufA8Rows& xa, int64_t K, const uint8_t* block,
                                             int64_t block_bytes, int64_t meta_area, Out y, int64_t N,
                                             const uint8_t* end) {
  constexpr int kSubs = static_cast<int>(kA8SuperK / kA8SumK);
  constexpr int64_t kGroupBytes = 192;  // two chunks' nibbles, then the high bits
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const int32_t* aw = reinterpret_cast<const int32_t*>(xa.a);
  const int64_t a_stride = K / 4, scale_stride = K / kA8SuperK, sum_stride = K / kA8SumK;
  for (int64_t s = 0; s < K / kA8SuperK; ++s) {
    __m512i scaled[R][C];  // sum_j sc_j (dot_j - 32 sum_j)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) scaled[r][c] = _mm512_setzero_si512();
    for (int j = 0; j < kSubs; ++j) {
      const int64_t g = s * kSubs + j;
      const uint8_t* at[C];
      __m512i high[C];
      for (int c = 0; c < C; ++c) {
        at[c] = block + c * block_bytes + meta_area + g * kGroupBytes;
        for (int line = 0; line < kGroupBytes; line += 64) prefetch_ahead(at[c] + line, end);
        high[c] = _mm512_loadu_si512(at[c] + 128);
      }
      __m512i dot[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dot[r][c] = _mm512_set1_epi32(-32 * xa.sum[r * sum_stride + g]);
      for (int ch = 0; ch < 2; ++ch) {
        __m512i lo[C], hi[C];
        for (int c = 0; c < C; ++c)
          gguf_a8_q6_codes(_mm512_loadu_si512(at[c] + 64 * ch), _mm512_srli_epi32(high[c], 8 * ch), lo[c], hi[c]);
        for (int r = 0; r < R; ++r) {
          const int32_t* ar = aw + r * a_stride + (g * 2 + ch) * 2;
          const __m512i alo = _mm512_set1_epi32(ar[0]), ahi = _mm512_set1_epi32(ar[1]);
          for (int c = 0; c < C; ++c) {
            dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], lo[c], alo);
            dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], hi[c], ahi);
          }
        }
      }
      for (int c = 0; c < C; ++c) {
        const uint8_t* sc = block + c * block_bytes + 288 * s + 32 + 16 * j;
        const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
        for (int r = 0; r < R; ++r) scaled[r][c] = _mm512_add_epi32(scaled[r][c], _mm512_mullo_epi32(dot[r][c], sc32));
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 d = half16(block + c * block_bytes + 288 * s);
      for (int r = 0; r < R; ++r)
        out[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xa.scale[r * scale_stride + s])),
                                    _mm512_cvtepi32_ps(scaled[r][c]), out[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) put(y, r, N, c * kBlockCols, out[r][c]);
}

// Blocks [b, b + C) of a Q4_K or Q6_K part: rows in tiles of up to kGgufRowBlock.
template <GgufType T, int C, typename Out>
FOLO_TARGET_AVX512_VNNI void gguf_a8_direct(const GgufA8Rows& xa, int64_t M, int64_t K, const uint8_t* block,
                                            int64_t block_bytes, int64_t meta_area, Out y, int64_t N,
                                            const uint8_t* end) {
  for (int64_t m = 0; m < M; m += kGgufRowBlock) {
    const GgufA8Rows rows{xa.a + m * K, xa.scale + m * (K / kA8SuperK), xa.sum + m * (K / kA8SumK)};
    const Out yr = offset(y, m, N, 0);
    const auto tile = [&](auto rows_in_tile) {
      constexpr int R = decltype(rows_in_tile)::value;
      if constexpr (T == GgufType::kQ6_K)
        gguf_a8_q6_tile<R, C>(rows, K, block, block_bytes, meta_area, yr, N, end);
      else
        gguf_a8_tile<R, C, R == 1 ? 2 : 1>(rows, K, block, block_bytes, meta_area, yr, N, end);
    };
    switch (std::min<int64_t>(kGgufRowBlock, M - m)) {
      case 4: tile(std::integral_constant<int, 4>{}); break;
      case 3: tile(std::integral_constant<int, 3>{}); break;
      case 2: tile(std::integral_constant<int, 2>{}); break;
      default: tile(std::integral_constant<int, 1>{}); break;
    }
  }
}

template <GgufType T, typename Out>
FOLO_TARGET_AVX512_VNNI void gguf_a8_typed_blocks(const GgufPartView& part, int64_t b0, int64_t b1,
                                                  const GgufA8Rows& xa, int64_t M, int64_t K, Out y, int64_t N) {
  const uint8_t* end = part.data + b1 * part.block_bytes;
  for (int64_t b = b0; b < b1; b += kGgufCols) {
    const uint8_t* block = part.data + b * part.block_bytes;
    const Out yb = offset(y, 0, N, part.col0 + b * kBlockCols);
    if (b + 1 < b1) gguf_a8_direct<T, 2>(xa, M, K, block, part.block_bytes, part.meta_area, yb, N, end);
    else gguf_a8_direct<T, 1>(xa, M, K, block, part.block_bytes, part.meta_area, yb, N, end);
  }
}

// Column blocks [b0, b1) of one part of y [M, N]: a Q4_K or Q6_K part from the rounded rows xa where given,
// any other (or xa null) from the bf16 rows x as gguf_blocks_bf16 computes it.
template <typename Out>
FOLO_TARGET_AVX512_VNNI void gguf_blocks_a8(const GgufPartView& part, int64_t b0, int64_t b1, const c10::BFloat16* x,
                                            const GgufA8Rows* xa, int64_t M, int64_t K, const float* xsum16, Out y,
                                            int64_t N) {
  if (xa != nullptr && static_cast<GgufType>(part.type) == GgufType::kQ4_K)
    gguf_a8_typed_blocks<GgufType::kQ4_K>(part, b0, b1, *xa, M, K, y, N);
  else if (xa != nullptr && static_cast<GgufType>(part.type) == GgufType::kQ6_K)
    gguf_a8_typed_blocks<GgufType::kQ6_K>(part, b0, b1, *xa, M, K, y, N);
  else
    gguf_blocks_bf16(part, b0, b1, x, M, K, xsum16, y, N);
}

}  // namespace
}  // namespace folovllm::cpu
