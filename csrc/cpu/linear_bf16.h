// The bf16 linear kernel's loops (linear.cpp registers the op; the layer chain's team, decoder_team.h,
// runs them on its own threads): see linear.cpp for the layout.
#pragma once

#include "isa.h"
#include "tiered.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>


namespace folovllm::cpu {
namespace {

constexpr int64_t kBlockRows = 64;  // output rows per packed block: four zmm accumulators per input row
constexpr int64_t kMaxRows = 6;     // input rows multiplied together: 6 x 4 accumulators stay in registers
constexpr int64_t kChunkRows = 128;  // input rows per work item: a prefill splits over threads along M too
constexpr int64_t kPrefetchAhead = 32;  // in zmm (64 B): 8 K pairs (2 KiB) ahead; 16 to 64 measured alike
constexpr int64_t kBlockLines = 4;  // cache lines per K pair of a block (256 bytes)

// Groups of kMaxRows rows (the last may have fewer) in M rows.
constexpr int64_t group_count(int64_t M) { return (M + kMaxRows - 1) / kMaxRows; }

FOLO_TARGET_AVX512_BF16 inline void store_bf16(c10::BFloat16* y, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v));
}

// Rows [m0, m0 + M) of x times block b of the packed weight: 4 x M fp32 accumulators in registers, and
// `next` pulled into L2 on the way.
template <int M>
FOLO_TARGET_AVX512_BF16 inline void block_rows(const uint32_t* x, int64_t pairs, const __m512bh* wb, const float* bias,
                                        c10::BFloat16* y, int64_t N, NextWeights next) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh* wp = wb + p * 4;
    _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchAhead + 2), _MM_HINT_T0);
    next.prefetch(p);
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

// Rows [0, rows) of x, 1 <= rows <= kMaxRows, times block wb.
FOLO_TARGET_AVX512_BF16 inline void group_rows(const uint32_t* x, int64_t rows, int64_t pairs, const __m512bh* wb,
                                               const float* bias, c10::BFloat16* y, int64_t N, NextWeights next) {
  switch (rows) {
    case 1: block_rows<1>(x, pairs, wb, bias, y, N, next); break;
    case 2: block_rows<2>(x, pairs, wb, bias, y, N, next); break;
    case 3: block_rows<3>(x, pairs, wb, bias, y, N, next); break;
    case 4: block_rows<4>(x, pairs, wb, bias, y, N, next); break;
    case 5: block_rows<5>(x, pairs, wb, bias, y, N, next); break;
    default: block_rows<kMaxRows>(x, pairs, wb, bias, y, N, next); break;
  }
}

// The part of block `b` that row group `group` of `groups` of the block before it pulls into L2, so that
// the first group of that block reads it from L2 instead of waiting on memory (faster per call at every
// row count timed, 1 to 128, on an AVX-512 BF16 host): the block's 4 lines per K pair spread over its first groups, all 4 lines
// per pair where there is one group (a row or a few), 2 where there are two or three, else 1 in each of
// the first four. Past those groups: none.
FOLO_TARGET_AVX512_BF16 inline NextWeights next_block_slice(const __m512bh* w, int64_t b, int64_t pairs, int64_t group,
                                                          int64_t groups) {
  const int lines = groups == 1 ? 4 : groups <= 3 ? 2 : 1;
  if (group * lines >= kBlockLines) return {};
  // a contiguous run of the block, `lines` lines per pair
  return {reinterpret_cast<const char*>(w + b * pairs * 4) + group * pairs * 64 * lines, 64 * lines, lines};
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
    const int64_t groups = group_count(last - first);
    for (int64_t m = first, g = 0; m < last; m += kMaxRows, ++g) {
      const NextWeights next = i + 1 < i1 ? next_block_slice(w, (i + 1) % blocks, pairs, g, groups) : NextWeights{};
      group_rows(x + m * pairs, std::min(kMaxRows, last - m), pairs, wb, bb, yb + m * N, N, next);
    }
  }
}

// A call of at most kChunkRows rows (a batched decode step) in finer items: item i is row group
// i % groups (kMaxRows rows, the last fewer) of block i / groups. A run of items a thread claims is whole
// blocks but at its edges, so each block is read by one thread or a few, and a weight of few blocks still
// splits evenly: at 64 rows a 576-row weight is 99 items, 50 and 49 on two threads, where whole blocks
// are 5 and 4 (faster per call there, timed on an AVX-512 BF16 host). Each output is the same sum as in linear_items,
// so the bits are too.
FOLO_TARGET_AVX512_BF16 void linear_group_items(const uint32_t* x, int64_t M, int64_t pairs, const __m512bh* w,
                                                const float* bias, c10::BFloat16* y, int64_t N, int64_t i0,
                                                int64_t i1) {
  const int64_t groups = group_count(M);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t b = i / groups, g = i % groups, m = g * kMaxRows;
    const NextWeights next = (b + 1) * groups < i1 ? next_block_slice(w, b + 1, pairs, g, groups) : NextWeights{};
    group_rows(x + m * pairs, std::min(kMaxRows, M - m), pairs, w + b * pairs * 4,
               bias == nullptr ? nullptr : bias + b * kBlockRows, y + b * kBlockRows + m * N, N, next);
  }
}

}  // namespace
}  // namespace folovllm::cpu
