// W4A16: y = x W^T with w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g], g = k / group_size, q in [0, 16);
// the last group may be partial (K = 576 in groups of 128), K a multiple of 8.
//
// The trick that keeps dequantizing cheap: the bf16 bit pattern 0x3F80 | (q << 3) is exactly 1 + q / 16,
// so two instructions (a shift, one ternary-logic op) turn 32 packed codes into 32 bf16 values, and
// AVX512_BF16's dot product multiplies them by bf16 activations pairwise in fp32. Over one group,
//   sum_k x_k w_k = 16 s * sum_k x_k (1 + q_k / 16) + (z - 24 s) * sum_k x_k,
// so the scale and zero are applied once per group and output column (two FMAs), not per weight; the
// activations' group sums are computed once per call.
//
// Packed layout (folovllm/model/quantization/cpu_int4.py: pack_int4 builds it once at load): columns in blocks of 16 (one vector of fp32
// lanes), K in chunks of 8; one chunk of one block is 16 uint32, lane j holding column j's 8 codes, codes
// 2p and 2p + 1 at bits 4p and 16 + 4p (so pair p is one shift away from a bf16 pair). Scales and zeros
// are [N / 16, groups, 16], fp32 or bf16.
//
// Loops: threads split the column blocks; each thread walks its blocks two at a time and, for each, all
// rows in blocks of 4, so a column block's codes stay in L1 while every row reads them (small M streams
// each weight byte once; large M amortizes the unpacking over 4 rows x 2 blocks of registers).
#pragma once

#include "quant_common.h"

namespace folovllm::cpu {
namespace {

constexpr int64_t kChunkK = 8;  // codes per uint32 lane
constexpr int kRowBlock = 4;    // rows held in registers at once
constexpr int kColBlocks = 2;   // column vectors held in registers at once

int64_t num_groups(int64_t K, int64_t group_size) { return (K + group_size - 1) / group_size; }

// Pair p (0..3) of a chunk's lanes as 16 bf16 pairs (1 + q / 16 each).
template <int P>
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512bh unpack_pair(__m512i lanes) {
  const __m512i mask = _mm512_set1_epi32(0x00780078);
  const __m512i one = _mm512_set1_epi32(0x3F803F80);
  __m512i shifted = P == 0 ? _mm512_slli_epi32(lanes, 3) : _mm512_srli_epi32(lanes, 4 * P - 3);
  // (shifted & mask) | one
  return (__m512bh)_mm512_ternarylogic_epi32(shifted, mask, one, 0xEA);
}

// One tile: R rows (<= kRowBlock) x C column blocks, all of K, with A accumulator sets per output vector
// (pair p of a chunk goes to set p % A: independent dot-product chains, so few rows still fill the pipes).
//   x: bf16 rows (stride K), xsum: [rows, groups] fp32, codes: column block's chunks ([K / 8, 16] uint32 each,
//   blocks `block_stride` uint32 apart), scales/zeros: [groups, 16] per block (`sz_stride` apart).
template <int R, int C, int A, typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void tile(const c10::BFloat16* x, int64_t K, const float* xsum, int64_t groups, const uint32_t* codes,
                    int64_t block_stride, const S* scales, const S* zeros, int64_t sz_stride, int64_t group_size,
                    Out* y, int64_t N, const uint32_t* codes_end) {
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const int64_t chunks_per_group = group_size / kChunkK;
  const int32_t* xw = reinterpret_cast<const int32_t*>(x);  // bf16 pairs
  const int64_t x_stride = K / 2;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[A][R][C];
    for (int a = 0; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[a][r][c] = _mm512_setzero_ps();
    const int64_t chunk0 = g * chunks_per_group;
    const int64_t chunk1 = std::min(chunk0 + chunks_per_group, K / kChunkK);
    for (int64_t ch = chunk0; ch < chunk1; ++ch) {
      __m512i lanes[C];
      for (int c = 0; c < C; ++c) {
        prefetch_ahead(codes + c * block_stride + ch * kBlockCols, codes_end);
        lanes[c] = _mm512_loadu_si512(codes + c * block_stride + ch * kBlockCols);
      }
      const int64_t pair0 = ch * (kChunkK / 2);
#define QG_PAIR(P)                                                                               \
  {                                                                                              \
    __m512bh w[C];                                                                               \
    for (int c = 0; c < C; ++c) w[c] = unpack_pair<P>(lanes[c]);                                 \
    for (int r = 0; r < R; ++r) {                                                                \
      __m512bh xv = (__m512bh)_mm512_set1_epi32(xw[r * x_stride + pair0 + P]);                   \
      for (int c = 0; c < C; ++c) acc[P % A][r][c] = _mm512_dpbf16_ps(acc[P % A][r][c], w[c], xv); \
    }                                                                                            \
  }
      QG_PAIR(0) QG_PAIR(1) QG_PAIR(2) QG_PAIR(3)
#undef QG_PAIR
    }
    for (int a = 1; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[0][r][c] = _mm512_add_ps(acc[0][r][c], acc[a][r][c]);
    for (int c = 0; c < C; ++c) {
      const __m512 s = load16(scales + c * sz_stride + g * kBlockCols);
      const __m512 z = load16(zeros + c * sz_stride + g * kBlockCols);
      const __m512 big_scale = _mm512_mul_ps(s, _mm512_set1_ps(16.f));
      const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(24.f), z);  // z - 24 s
      for (int r = 0; r < R; ++r) {
        out[r][c] = _mm512_fmadd_ps(big_scale, acc[0][r][c], out[r][c]);
        out[r][c] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), out[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      store16(y + r * N + c * kBlockCols, out[r][c]);
    }
}

// About 8-16 independent chains per tile: 4 sets for one row, 2 for two or four rows, 1 for three.
template <int C, typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void rows_tile(int rows, const c10::BFloat16* x, int64_t K, const float* xsum, int64_t groups,
                         const uint32_t* codes, int64_t block_stride, const S* scales, const S* zeros,
                         int64_t sz_stride, int64_t group_size, Out* y, int64_t N, const uint32_t* codes_end) {
  switch (rows) {
    case 4: tile<4, C, 2>(x, K, xsum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N, codes_end); break;
    case 3: tile<3, C, 1>(x, K, xsum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N, codes_end); break;
    case 2: tile<2, C, 2>(x, K, xsum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N, codes_end); break;
    default: tile<1, C, 4>(x, K, xsum, groups, codes, block_stride, scales, zeros, sz_stride, group_size, y, N, codes_end); break;
  }
}

// y[M, N] (Out) from bf16 x[M, K], over column blocks [b0, b1).
template <typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void gemm_blocks(const c10::BFloat16* x, int64_t M, int64_t K, const float* xsum, int64_t groups,
                           const uint32_t* codes, const S* scales, const S* zeros, int64_t group_size, Out* y,
                           int64_t N, int64_t b0, int64_t b1) {
  const int64_t block_stride = (K / kChunkK) * kBlockCols;
  const int64_t sz_stride = groups * kBlockCols;
  const uint32_t* codes_end = codes + b1 * block_stride;  // this thread's last weight byte, + 1
  for (int64_t b = b0; b < b1; b += kColBlocks) {
    const int cols = static_cast<int>(std::min<int64_t>(kColBlocks, b1 - b));
    for (int64_t m = 0; m < M; m += kRowBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, M - m));
      const auto* xr = x + m * K;
      const float* sr = xsum + m * groups;
      const uint32_t* cb = codes + b * block_stride;
      const S* sb = scales + b * sz_stride;
      const S* zb = zeros + b * sz_stride;
      Out* yr = y + m * N + b * kBlockCols;
      if (cols == 2)
        rows_tile<2>(rows, xr, K, sr, groups, cb, block_stride, sb, zb, sz_stride, group_size, yr, N, codes_end);
      else
        rows_tile<1>(rows, xr, K, sr, groups, cb, block_stride, sb, zb, sz_stride, group_size, yr, N, codes_end);
    }
  }
}

// Per row and group: the sum of the bf16 activations, in fp32, 8 at a time (K and group_size are
// multiples of 8): at batch 64 a one-at-a-time loop here took ~15% of a call, before the threads start.
FOLO_TARGET_AVX512_BF16 void group_sums(const c10::BFloat16* x, int64_t M, int64_t K, int64_t group_size, float* out) {
  const int64_t groups = num_groups(K, group_size);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const c10::BFloat16* p = x + m * K;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t k = g * group_size; k < std::min(K, (g + 1) * group_size); k += kChunkK) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k));
        acc = _mm256_add_ps(acc, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
      }
      __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      sum4 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
      out[m * groups + g] = _mm_cvtss_f32(_mm_add_ss(sum4, _mm_movehdup_ps(sum4)));
    }
}

// perm must be int64 [K] with every index in [0, K): int4_gemm_perm's permutation of x's columns.
void check_permutation(const at::Tensor& perm, int64_t K) {
  TORCH_CHECK(perm.dim() == 1 && perm.size(0) == K && perm.scalar_type() == at::kLong && perm.is_contiguous(),
              "perm must be a contiguous int64 [K], a permutation of x's columns (K = ", K, ")");
  const int64_t* p = perm.const_data_ptr<int64_t>();
  const auto [low, high] = std::minmax_element(p, p + K);
  TORCH_CHECK(K == 0 || (*low >= 0 && *high < K), "perm holds indices outside [0, ", K, ")");
}

// out[k] = x[order[k]] for one row of K bf16 values, 8 at a time with AVX-512 gathers: a 4-byte load at
// x + order[k] keeps x[order[k]] in its low half. Element K - 1 is copied apart, since its 4-byte load
// would pass the row's end.
FOLO_TARGET_AVX512_BF16 inline void gather_row(const c10::BFloat16* x, const int64_t* order, int64_t K, c10::BFloat16* out) {
  const __m512i last = _mm512_set1_epi64(K - 1);
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m512i index = _mm512_loadu_si512(order + k);
    const __mmask8 inside = _mm512_cmpneq_epi64_mask(index, last);
    const __m256i words = _mm512_mask_i64gather_epi32(_mm256_setzero_si256(), inside, index, x, 2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm256_cvtepi32_epi16(words));
    if (inside != 0xFF)
      for (int j = 0; j < 8; ++j)
        if (order[k + j] == K - 1) out[k + j] = x[K - 1];
  }
  for (; k < K; ++k) out[k] = x[order[k]];
}

void check_int4_packed(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t K,
                  int64_t group_size) {
  TORCH_CHECK(codes.scalar_type() == at::kInt && codes.dim() == 3 && codes.size(2) == kBlockCols &&
                  codes.is_contiguous(), "codes must be int32 [N / 16, K / 8, 16], contiguous (pack_int4's form)");
  TORCH_CHECK(group_size > 0 && group_size % kChunkK == 0, "group_size must be a positive multiple of 8");
  TORCH_CHECK(codes.size(1) * kChunkK == K, "x's last dim (", K, ") does not match the packed weight's K (",
              codes.size(1) * kChunkK, ")");
  const int64_t groups = num_groups(K, group_size);
  for (const at::Tensor* t : {&scales, &zeros}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == codes.size(0) && t->size(1) == groups && t->size(2) == kBlockCols &&
                    t->is_contiguous(), "scales/zeros must be [N / 16, ceil(K / group_size), 16], contiguous");
  }
  TORCH_CHECK(scales.scalar_type() == zeros.scalar_type() &&
                  (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kBFloat16),
              "scales and zeros must both be float32 or both bfloat16");
}

// bf16 rows [M, K] -> y [M, N] (bf16 or fp32).
void run_int4(const at::Tensor& xb, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
              int64_t group_size, at::Tensor& y) {
  const int64_t M = xb.size(0), K = xb.size(1), N = y.size(1), groups = num_groups(K, group_size);
  std::vector<float> xsum(M * groups);
  group_sums(xb.const_data_ptr<c10::BFloat16>(), M, K, group_size, xsum.data());
  const int64_t blocks = N / kBlockCols;
  const auto* xp = xb.const_data_ptr<c10::BFloat16>();
  const auto* cp = reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>());
  parallel_tasks((blocks + kColBlocks - 1) / kColBlocks, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kColBlocks, b1 = std::min(blocks, p1 * kColBlocks);
    auto blocks_to = [&](auto* out) {
      if (scales.scalar_type() == at::kBFloat16)
        gemm_blocks(xp, M, K, xsum.data(), groups, cp, scales.const_data_ptr<c10::BFloat16>(),
                    zeros.const_data_ptr<c10::BFloat16>(), group_size, out, N, b0, b1);
      else
        gemm_blocks(xp, M, K, xsum.data(), groups, cp, scales.const_data_ptr<float>(),
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
