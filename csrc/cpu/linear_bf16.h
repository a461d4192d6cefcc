// The bf16 linear kernel's loops (linear_bf16.cpp registers the op; the layer chain's team, decoder_team.h,
// runs them on its own threads): see linear_bf16.cpp for the layout.
#pragma once

#include "isa.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>


namespace folovllm::cpu {
namespace {

constexpr int64_t kBlockRows = 64;  // output rows per packed block: four zmm accumulators per input row
constexpr int64_t kMaxRows = 6;     // input rows multiplied together: 6 x 4 accumulators stay in registers
constexpr int64_t kChunkRows = 128;  // input rows per work item: a prefill splits over threads along M too
constexpr int64_t kPrefetchAhead = 32;  // in zmm (64 B): 8 K pairs (2 KiB) ahead; 16 to 64 measured alike

FOLO_TARGET_AVX512_BF16 inline void store_bf16(c10::BFloat16* y, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v));
}

// Rows [m0, m0 + M) of x times block b of the packed weight: 4 x M fp32 accumulators in registers.
template <int M>
FOLO_TARGET_AVX512_BF16 inline void block_rows(const uint32_t* x, int64_t pairs, const __m512bh* wb, const float* bias,
                                        c10::BFloat16* y, int64_t N) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh* wp = wb + p * 4;
    _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchAhead + 2), _MM_HINT_T0);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * pairs + p]));
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wp[j]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) {
      __m512 v = acc[m][j];
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j * 16));
      store_bf16(y + m * N + j * 16, v);
    }
}

// Work items [i0, i1): item i is weight block i % blocks times input rows of chunk i / blocks. A block
// (64 x K) is read from memory once per chunk and stays in cache while every group of kMaxRows rows
// multiplies it.
FOLO_TARGET_AVX512_BF16 void linear_items(const uint32_t* x, int64_t M, int64_t pairs, const __m512bh* w,
                                   const float* bias, c10::BFloat16* y, int64_t N, int64_t i0, int64_t i1) {
  const int64_t blocks = N / kBlockRows;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t b = i % blocks, first = (i / blocks) * kChunkRows, last = std::min(M, first + kChunkRows);
    const __m512bh* wb = w + b * pairs * 4;
    const float* bb = bias == nullptr ? nullptr : bias + b * kBlockRows;
    c10::BFloat16* yb = y + b * kBlockRows;
    int64_t m = first;
    for (; m + kMaxRows <= last; m += kMaxRows) block_rows<kMaxRows>(x + m * pairs, pairs, wb, bb, yb + m * N, N);
    switch (last - m) {
      case 1: block_rows<1>(x + m * pairs, pairs, wb, bb, yb + m * N, N); break;
      case 2: block_rows<2>(x + m * pairs, pairs, wb, bb, yb + m * N, N); break;
      case 3: block_rows<3>(x + m * pairs, pairs, wb, bb, yb + m * N, N); break;
      case 4: block_rows<4>(x + m * pairs, pairs, wb, bb, yb + m * N, N); break;
      case 5: block_rows<5>(x + m * pairs, pairs, wb, bb, yb + m * N, N); break;
      default: break;
    }
  }
}


}  // namespace
}  // namespace folovllm::cpu
