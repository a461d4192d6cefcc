// W4A8: the int4 matmul of quant_int4.h (same packed codes, scales and zeros) with the activations
// rounded to int8, one scale per row and weight group, so the codes meet them in AVX512_VNNI's byte dot
// product (vpdpbusd: 64 products per instruction, 4 per fp32 lane) instead of being widened to bf16 first.
// At one row the bf16 kernel spends more time widening codes than reading them; here 32 codes take
// one AND and 16 a shift, where the bf16 path takes two instructions per 32.
//
// Over one group, with x_k ~ d a_k (a_k int8, d = max |x_k| / 127 over the group) and w = (q - 8) s + z:
//   sum_k x_k w_k ~ sum_k d a_k w_k = s d sum_k a_k q_k + (z - 8 s) d sum_k a_k,
// both integer sums exact in int32. (Taking the second sum from x itself instead would leave the rounding
// errors multiplied by q, in [0, 16), rather than by the centred weight: ~3x the error.)
//
// The packed lane (quant_int4.h) holds a column's 8 codes c0..c7 as bytes (c0 | c2 << 4), (c4 | c6 << 4),
// (c1 | c3 << 4), (c5 | c7 << 4): its low nibbles are c0 c4 c1 c5 and its high nibbles c2 c6 c3 c7. The
// activations are stored in that order per chunk of 8, so each masked nibble set lines up with 4 of them.
#pragma once

#include "quant_int4.h"

#include <memory>

namespace folovllm::cpu {
namespace {

bool cpu_vnni_supported() { return cpu_supported() && host_has_vnni(); }

// 8 fp32 values from fp32 or bf16 storage.
FOLO_TARGET_AVX512_VNNI FOLO_INLINE __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
FOLO_TARGET_AVX512_VNNI FOLO_INLINE __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

FOLO_TARGET_AVX512_VNNI FOLO_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

FOLO_TARGET_AVX512_VNNI FOLO_INLINE float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// x [M, K] (bf16 or fp32) -> a [M, K] int8 (each chunk of 8 in nibble order c0 c4 c1 c5 c2 c6 c3 c7),
// scale [M, groups] (d) and sum [M, groups] (d sum_k a_k).
template <typename T>
FOLO_TARGET_AVX512_VNNI void quantize_activations(const T* x, int64_t M, int64_t K, int64_t group_size, int8_t* a,
                                         float* scale, float* sum) {
  const int64_t groups = num_groups(K, group_size);
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m128i order = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * K;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group_size, k1 = std::min(K, k0 + group_size);
      __m256 amax = _mm256_setzero_ps();
      for (int64_t k = k0; k < k1; k += kChunkK) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load8(row + k)));
      const float d = hmax8(amax) / 127.f;
      const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
      __m256i total = _mm256_setzero_si256();
      for (int64_t k = k0; k < k1; k += kChunkK) {
        const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(load8(row + k), inv));  // nearest, |q| <= 127
        total = _mm256_add_epi32(total, q);
        const __m128i bytes = _mm_shuffle_epi8(_mm256_cvtepi32_epi8(q), order);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(a + m * K + k), bytes);
      }
      scale[m * groups + g] = d;
      sum[m * groups + g] = d * hsum8(_mm256_cvtepi32_ps(total));
    }
  }
}

// One tile: R rows x C column blocks over all of K; low and high nibbles accumulate apart (two
// independent chains per output vector). a: int8 rows (stride K), scale/sum: [rows, groups].
template <int R, int C, typename S, typename Out>
FOLO_TARGET_AVX512_VNNI void a8_tile(const int8_t* a, int64_t K, const float* scale, const float* sum, int64_t groups,
                            const uint32_t* codes, int64_t block_stride, const S* scales, const S* zeros,
                            int64_t sz_stride, int64_t group_size, Out* y, int64_t N) {
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int32_t* aw = reinterpret_cast<const int32_t*>(a);  // 4 activations per int32, 2 per chunk
  const int64_t a_stride = K / 4;
  const int64_t chunks_per_group = group_size / kChunkK;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[2][R][C];
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[h][r][c] = _mm512_setzero_si512();
    const int64_t chunk0 = g * chunks_per_group;
    const int64_t chunk1 = std::min(chunk0 + chunks_per_group, K / kChunkK);
    for (int64_t ch = chunk0; ch < chunk1; ++ch) {
      __m512i lo[C], hi[C];
      for (int c = 0; c < C; ++c) {
        prefetch_ahead(codes + c * block_stride + ch * kBlockCols);
        const __m512i lanes = _mm512_loadu_si512(codes + c * block_stride + ch * kBlockCols);
        lo[c] = _mm512_and_si512(lanes, low);
        hi[c] = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i alo = _mm512_set1_epi32(aw[r * a_stride + 2 * ch]);
        const __m512i ahi = _mm512_set1_epi32(aw[r * a_stride + 2 * ch + 1]);
        for (int c = 0; c < C; ++c) {
          acc[0][r][c] = _mm512_dpbusd_epi32(acc[0][r][c], lo[c], alo);
          acc[1][r][c] = _mm512_dpbusd_epi32(acc[1][r][c], hi[c], ahi);
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 s = load16(scales + c * sz_stride + g * kBlockCols);
      const __m512 z = load16(zeros + c * sz_stride + g * kBlockCols);
      const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(8.f), z);  // z - 8 s
      for (int r = 0; r < R; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[0][r][c], acc[1][r][c]));
        const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(scale[r * groups + g]));
        out[r][c] = _mm512_fmadd_ps(sd, dot, out[r][c]);
        out[r][c] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sum[r * groups + g]), out[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store16(y + r * N + c * kBlockCols, out[r][c]);
}

template <int C, typename S, typename Out>
FOLO_TARGET_AVX512_VNNI void a8_rows(int rows, const int8_t* a, int64_t K, const float* scale, const float* sum,
                            int64_t groups, const uint32_t* codes, int64_t block_stride, const S* scales,
                            const S* zeros, int64_t sz_stride, int64_t group_size, Out* y, int64_t N) {
  switch (rows) {
    case 4: a8_tile<4, C>(a, K, scale, sum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N); break;
    case 3: a8_tile<3, C>(a, K, scale, sum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N); break;
    case 2: a8_tile<2, C>(a, K, scale, sum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N); break;
    default: a8_tile<1, C>(a, K, scale, sum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N); break;
  }
}

// Column blocks [b0, b1) of y [M, N] from the quantized rows, two blocks at a time, rows in blocks of 4.
template <typename S, typename Out>
FOLO_TARGET_AVX512_VNNI void a8_blocks(const int8_t* a, int64_t M, int64_t K, const float* scale, const float* sum,
                              int64_t groups, const uint32_t* codes, const S* scales, const S* zeros,
                              int64_t group_size, Out* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t block_stride = (K / kChunkK) * kBlockCols;
  const int64_t sz_stride = groups * kBlockCols;
  for (int64_t b = b0; b < b1; b += kColBlocks) {
    const int cols = static_cast<int>(std::min<int64_t>(kColBlocks, b1 - b));
    for (int64_t m = 0; m < M; m += kRowBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, M - m));
      const int8_t* ar = a + m * K;
      const float* dr = scale + m * groups;
      const float* sr = sum + m * groups;
      const uint32_t* cb = codes + b * block_stride;
      const S* sb = scales + b * sz_stride;
      const S* zb = zeros + b * sz_stride;
      Out* yr = y + m * N + b * kBlockCols;
      if (cols == 2)
        a8_rows<2>(rows, ar, K, dr, sr, groups, cb, block_stride, sb, zb, sz_stride, group_size, yr, N);
      else
        a8_rows<1>(rows, ar, K, dr, sr, groups, cb, block_stride, sb, zb, sz_stride, group_size, yr, N);
    }
  }
}

// x [M, K] (bf16 or fp32, contiguous) -> y [M, N] in x's dtype.
void run_int4_a8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                 int64_t group_size, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), groups = num_groups(K, group_size);
  const std::unique_ptr<int8_t[]> a_buffer(new int8_t[M * K]);  // no zero fill: every byte is written
  int8_t* const a = a_buffer.get();
  std::vector<float> scale(M * groups), sum(M * groups);
  // rows split over the threads too: done serially, rounding a prefill's activations cost more than it saved
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t m0, int64_t m1) {
    const int64_t off = m0 * K, goff = m0 * groups;
    if (x.scalar_type() == at::kBFloat16)
      quantize_activations(x.const_data_ptr<c10::BFloat16>() + off, m1 - m0, K, group_size, a + off,
                           scale.data() + goff, sum.data() + goff);
    else
      quantize_activations(x.const_data_ptr<float>() + off, m1 - m0, K, group_size, a + off,
                           scale.data() + goff, sum.data() + goff);
  });
  const int64_t blocks = N / kBlockCols;
  const auto* cp = reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>());
  parallel_tasks((blocks + kColBlocks - 1) / kColBlocks, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kColBlocks, b1 = std::min(blocks, p1 * kColBlocks);
    auto blocks_to = [&](auto* out) {
      if (scales.scalar_type() == at::kBFloat16)
        a8_blocks(a, M, K, scale.data(), sum.data(), groups, cp, scales.const_data_ptr<c10::BFloat16>(),
                  zeros.const_data_ptr<c10::BFloat16>(), group_size, out, N, b0, b1);
      else
        a8_blocks(a, M, K, scale.data(), sum.data(), groups, cp, scales.const_data_ptr<float>(),
                  zeros.const_data_ptr<float>(), group_size, out, N, b0, b1);
    };
    if (y.scalar_type() == at::kFloat)
      blocks_to(y.mutable_data_ptr<float>());
    else
      blocks_to(y.mutable_data_ptr<c10::BFloat16>());
  });
}

}  // namespace
}  // namespace folovllm::cpu
