// The CPU attention kernel's decode fast path (AVX-512): items of one query row with head_dim 32, 64 or 128
// keep q and the accumulators of a block of group heads in registers and widen K/V rows as they load
// them. attention.cpp takes it at the AVX-512 tier.
//
// A batch's K/V rows sit in blocks scattered over the cache, 128 bytes per row and kv head, so a plain
// loop stalls on every tile's first loads. With prefetch_next each tile of kDecodeKeyTile keys asks
// for the next tile's rows (its own item's, or the first of the item its thread runs next) into L2, a
// few per key as it computes, so memory streams the next rows while these are multiplied. Only when loads
// happen changes: the outputs are the same bits either way.
#pragma once

#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>


namespace folovllm::cpu {
namespace {

FOLO_TARGET_AVX512 FOLO_INLINE __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
// bf16 -> fp32 is a 16-bit shift: widen in a register instead of through a buffer
FOLO_TARGET_AVX512 FOLO_INLINE __m512 load16(const c10::BFloat16* x) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
FOLO_TARGET_AVX512 FOLO_INLINE void store16(float* x, __m512 v) { _mm512_storeu_ps(x, v); }
// round to nearest even, as c10::BFloat16's conversion does (NaN aside: the kernel never makes one)
FOLO_TARGET_AVX512 FOLO_INLINE void store16(c10::BFloat16* x, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// The four lane sums of part[0..3], in order.
FOLO_TARGET_AVX512 FOLO_INLINE __m128 reduce4(const __m512* part) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(part[0], part[1]), _mm512_unpackhi_ps(part[0], part[1]));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(part[2], part[3]), _mm512_unpackhi_ps(part[2], part[3]));
  // per 128-bit lane: [sum0, sum1, sum2, sum3] of that lane's elements
  const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lanes), _mm512_extractf32x8_ps(lanes, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Asks for the cache lines of one K/V row: a tile's rows sit in scattered blocks, so requesting
// them all before the tile's arithmetic overlaps their memory latencies. Into L1 for the tile about to
// compute; into L2 (kHint = _MM_HINT_T1) for the next tile's, so they do not push this tile's rows out of L1.
template <int D, auto kHint = _MM_HINT_T0, typename scalar_t>
FOLO_INLINE void prefetch_row(const scalar_t* row) {
  constexpr int kLine = 64;
  for (int b = 0; b < D * static_cast<int>(sizeof(scalar_t)); b += kLine)
    _mm_prefetch(reinterpret_cast<const char*>(row) + b, kHint);
}

// Row offsets of keys [t0, t1) of one kv head, walking the block table from t0's block.
template <typename scalar_t>
FOLO_INLINE int key_offsets(const Problem<scalar_t>& p, const int64_t* table, int64_t kv_head, int64_t t0,
                            int64_t t1, int64_t* offsets) {
  const int64_t token_stride = p.num_kv_heads * p.head_dim;
  int64_t block = t0 / p.block_size, in_block = t0 % p.block_size;
  for (int64_t t = t0; t < t1; ++t) {
    offsets[t - t0] = (table[block] * p.block_size + in_block) * token_stride + kv_head * p.head_dim;
    if (++in_block == p.block_size) {
      in_block = 0;
      ++block;
    }
  }
  return static_cast<int>(t1 - t0);
}

// Keys per tile for an item reading ``keys`` keys: as few tiles as kDecodeKeyTile allows, of equal size
// (200 keys: 4 x 50), so no short last tile has to prefetch a whole next tile while it computes.
FOLO_INLINE int64_t decode_tile(int64_t keys) {
  const int64_t tiles = (keys + kDecodeKeyTile - 1) / kDecodeKeyTile;
  return (keys + tiles - 1) / tiles;
}

// Prefetches the next tile's rows a few at a time while this tile computes: rows [*done, target) of
// ``ahead`` (offsets into ``cache``), so memory streams the next rows while these are multiplied.
template <int D, typename scalar_t>
FOLO_INLINE void prefetch_ahead(const scalar_t* cache, const int64_t* ahead, int* done, int target) {
  for (; *done < target; ++*done) prefetch_row<D, _MM_HINT_T1>(cache + ahead[*done]);
}

// The largest of s[0..n), 16 lanes at a time (masked tail).
FOLO_TARGET_AVX512 FOLO_INLINE float max_n(const float* s, int n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    m = _mm512_mask_max_ps(m, mask, m, _mm512_maskz_loadu_ps(mask, s + i));
  }
  return _mm512_reduce_max_ps(m);
}

// s[i] = exp(s[i] - shift) for i < n, in place (exp16, 16 lanes at a time, masked tail); returns their sum.
FOLO_TARGET_AVX512 FOLO_INLINE float exp_shifted_sum(float* s, int n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 total = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + i), sh)));
    _mm512_mask_storeu_ps(s + i, mask, e);
    total = _mm512_add_ps(total, e);
  }
  return _mm512_reduce_add_ps(total);
}

// Scores of one tile's n keys for R heads of a bf16 problem with vdpbf16ps: bf16 q and K pairs multiply
// exactly and sum in fp32 (no widening, half the multiply instructions), the scale applied to the sums.
template <int NV, int R>
FOLO_TARGET_AVX512_BF16 __attribute__((noinline)) void score_tile_bf16_dot(const Problem<c10::BFloat16>& p,
                                                                      int64_t first_head, int64_t token,
                                                                      const int64_t* offsets, int n, float* scores,
                                                                      const int64_t* ahead, int num_ahead) {
  constexpr int D = NV * 16, NP = NV / 2;  // a zmm holds 32 bf16: 16 pairs
  int prefetched = 0;
  __m512bh q[R][NP];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NP; ++v)
      q[r][v] = (__m512bh)_mm512_loadu_si512(p.query + (token * p.num_heads + first_head + r) * D + 32 * v);
  const __m128 scale = _mm_set1_ps(p.scale);
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    prefetch_ahead<D>(p.k_cache, ahead, &prefetched, (i + 4) * num_ahead / n);
    __m512bh k[4][NP];
    for (int j = 0; j < 4; ++j)
      for (int v = 0; v < NP; ++v) k[j][v] = (__m512bh)_mm512_loadu_si512(p.k_cache + offsets[i + j] + 32 * v);
    for (int r = 0; r < R; ++r) {
      __m512 part[4];
      for (int j = 0; j < 4; ++j) {
        part[j] = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[r][0], k[j][0]);
        for (int v = 1; v < NP; ++v) part[j] = _mm512_dpbf16_ps(part[j], q[r][v], k[j][v]);
      }
      _mm_storeu_ps(scores + r * kKeyTile + i, _mm_mul_ps(reduce4(part), scale));
    }
  }
  for (; i < n; ++i) {
    for (int r = 0; r < R; ++r) {
      __m512 part = _mm512_setzero_ps();
      for (int v = 0; v < NP; ++v)
        part = _mm512_dpbf16_ps(part, q[r][v], (__m512bh)_mm512_loadu_si512(p.k_cache + offsets[i] + 32 * v));
      scores[r * kKeyTile + i] = _mm512_reduce_add_ps(part) * p.scale;
    }
  }
  prefetch_ahead<D>(p.k_cache, ahead, &prefetched, num_ahead);
}

// Decode fast path (AVX-512): one query row, R heads of a kv head's group, head_dim 16 * NV. q and
// the R accumulators stay in registers, K/V rows are widened as they are loaded, and each loaded
// K/V row feeds all R heads. With ``next`` (prefetch_next), the rows of the tile that follows (this
// block's next tile, else ``next``'s first) are prefetched while each tile computes.
template <int NV, int R, typename scalar_t>
FOLO_TARGET_AVX512 FOLO_INLINE void attend_decode_rows(const Problem<scalar_t>& p, const int64_t* table, int64_t kv_head,
                                                int64_t first_head, int64_t token, int64_t first_key,
                                                int64_t num_keys, const NextKeys* next, Workspace& ws) {
  constexpr int D = NV * 16;
  float* scores = ws.scores.data();
  int64_t* offsets = ws.offsets.data();
  int64_t* ahead = ws.ahead.data();
  const __m512 scale = _mm512_set1_ps(p.scale);
  __m512 q[R][NV], acc[R][NV];
  float row_max[R], row_sum[R];
  for (int r = 0; r < R; ++r) {
    const scalar_t* src = p.query + (token * p.num_heads + first_head + r) * D;
    for (int v = 0; v < NV; ++v) {
      q[r][v] = _mm512_mul_ps(load16(src + 16 * v), scale);
      acc[r][v] = _mm512_setzero_ps();
    }
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
  }
  const int64_t tile = decode_tile(num_keys - first_key);
  for (int64_t t0 = first_key; t0 < num_keys; t0 += tile) {
    // walk the block table key by key (a division per key costs more than the key's dot products)
    const int n = key_offsets(p, table, kv_head, t0, std::min<int64_t>(t0 + tile, num_keys), offsets);
    for (int i = 0; i < n; ++i) {
      prefetch_row<D>(p.k_cache + offsets[i]);
      prefetch_row<D>(p.v_cache + offsets[i]);
    }
    int num_ahead = 0;
    if (next != nullptr) {
      const int64_t t1 = t0 + tile, next_tile = decode_tile(next->num_keys - next->first_key);
      num_ahead = t1 < num_keys
                      ? key_offsets(p, table, kv_head, t1, std::min<int64_t>(t1 + tile, num_keys), ahead)
                      : key_offsets(p, next->table, next->kv_head, next->first_key,
                                    std::min<int64_t>(next->first_key + next_tile, next->num_keys), ahead);
    }
    int k_ahead = 0, v_ahead = 0;  // rows of ``ahead`` prefetched so far
    int i = 0;
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      if (p.bf16_dot) {
        score_tile_bf16_dot<NV, R>(p, first_head, token, offsets, n, scores, ahead, num_ahead);
        i = n;
        k_ahead = num_ahead;  // the score tile prefetched them
      }
    }
    for (; i + 4 <= n; i += 4) {  // four keys at a time share one horizontal reduction
      prefetch_ahead<D>(p.k_cache, ahead, &k_ahead, (i + 4) * num_ahead / n);
      __m512 kv[4][NV];
      for (int j = 0; j < 4; ++j)
        for (int v = 0; v < NV; ++v) kv[j][v] = load16(p.k_cache + offsets[i + j] + 16 * v);
      for (int r = 0; r < R; ++r) {
        __m512 part[4];
        for (int j = 0; j < 4; ++j) {
          part[j] = _mm512_mul_ps(q[r][0], kv[j][0]);
          for (int v = 1; v < NV; ++v) part[j] = _mm512_fmadd_ps(q[r][v], kv[j][v], part[j]);
        }
        _mm_storeu_ps(scores + r * kKeyTile + i, reduce4(part));
      }
    }
    for (; i < n; ++i) {
      const scalar_t* k = p.k_cache + offsets[i];
      __m512 kv[NV];
      for (int v = 0; v < NV; ++v) kv[v] = load16(k + 16 * v);
      for (int r = 0; r < R; ++r) {
        __m512 part = _mm512_mul_ps(q[r][0], kv[0]);
        for (int v = 1; v < NV; ++v) part = _mm512_fmadd_ps(q[r][v], kv[v], part);
        scores[r * kKeyTile + i] = _mm512_reduce_add_ps(part);
      }
    }
    prefetch_ahead<D>(p.k_cache, ahead, &k_ahead, num_ahead);
    for (int r = 0; r < R; ++r) {
      float* s = scores + r * kKeyTile;
      const float new_max = std::max(row_max[r], max_n(s, n));
      const float correction = std::exp(row_max[r] - new_max);
      row_max[r] = new_max;
      row_sum[r] = row_sum[r] * correction + exp_shifted_sum(s, n, new_max);
      const __m512 c = _mm512_set1_ps(correction);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_mul_ps(acc[r][v], c);
    }
    for (int i = 0; i < n; ++i) {
      if ((i & 3) == 0) prefetch_ahead<D>(p.v_cache, ahead, &v_ahead, std::min(i + 4, n) * num_ahead / n);
      const scalar_t* val = p.v_cache + offsets[i];
      __m512 vv[NV];
      for (int v = 0; v < NV; ++v) vv[v] = load16(val + 16 * v);
      for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(scores[r * kKeyTile + i]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(w, vv[v], acc[r][v]);
      }
    }
    prefetch_ahead<D>(p.v_cache, ahead, &v_ahead, num_ahead);
  }
  for (int r = 0; r < R; ++r) {
    scalar_t* dst = p.out + (token * p.num_heads + first_head + r) * D;
    const __m512 inv = _mm512_set1_ps(1.f / row_sum[r]);
    for (int v = 0; v < NV; ++v) store16(dst + 16 * v, _mm512_mul_ps(acc[r][v], inv));
  }
}

// The keys an item reads: [first, end).
FOLO_INLINE NextKeys item_keys(const Item& item, const int64_t* block_tables, int64_t table_width,
                               const int64_t* seq_lens, const int64_t* query_start_loc, int64_t sliding_window) {
  const int64_t q_len = query_start_loc[item.seq + 1] - query_start_loc[item.seq];
  const int64_t context = seq_lens[item.seq] - q_len;
  return {block_tables + item.seq * table_width, item.kv_head,
          first_visible_key(context + item.q_begin, sliding_window), context + item.q_end};
}

// One decode item (a single query row, every head of one kv head's group) in register blocks of at
// most kMaxDecodeRows heads (half that at head_dim 128, so the accumulators fit the 32 registers).
// ``next_item``: the item this thread runs after it, whose first keys the last block prefetches
// (prefetch_next; null: none).
template <int NV, typename scalar_t>
FOLO_TARGET_AVX512 __attribute__((noinline)) void attend_decode_item(const Item& item, const Problem<scalar_t>& p,
                                                              Workspace& ws, const Item* next_item) {
  constexpr int block = NV <= 4 ? kMaxDecodeRows : kMaxDecodeRows / 2;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t q_start = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_start;
  const int64_t pos = p.seq_lens[item.seq] - q_len + item.q_begin;  // the row's position: context + q_begin
  const int64_t* table = p.block_tables + item.seq * p.table_width;
  const int64_t first_key = first_visible_key(pos, p.sliding_window);
  const NextKeys same{table, item.kv_head, first_key, pos + 1};
  NextKeys after{};
  if (p.prefetch_next && next_item != nullptr)
    after = item_keys(*next_item, p.block_tables, p.table_width, p.seq_lens, p.query_start_loc, p.sliding_window);
  for (int64_t g0 = 0; g0 < group; g0 += block) {
    const int64_t head = item.kv_head * group + g0;
    const int64_t token = q_start + item.q_begin;
    const NextKeys* next = !p.prefetch_next ? nullptr : g0 + block < group ? &same : next_item ? &after : nullptr;
#define FOLO_DECODE_ROWS(R) \
  attend_decode_rows<NV, R>(p, table, item.kv_head, head, token, first_key, pos + 1, next, ws)
    switch (std::min<int64_t>(block, group - g0)) {
      case 1: FOLO_DECODE_ROWS(1); break;
      case 2: FOLO_DECODE_ROWS(2); break;
      case 3: if constexpr (block >= 3) FOLO_DECODE_ROWS(3); break;
      default: if constexpr (block >= 4) FOLO_DECODE_ROWS(4); break;
    }
#undef FOLO_DECODE_ROWS
  }
}

}  // namespace
}  // namespace folovllm::cpu
