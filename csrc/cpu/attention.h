// The CPU paged-attention kernel's work items, problem description and per-thread scratch, shared by
// its portable path (attention.cpp), its AVX-512 decode path (attention_decode.h) and the per-tier decode
// form's caller.
#pragma once

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace folovllm::cpu {
namespace {

constexpr int kKeyTile = 128;     // keys per online-softmax update
// most keys per update on the decode fast path: a tile's K/V rows stay in L1 while the next tile's are
// prefetched into L2 (64 keys measured 1.1-1.2x faster than 128 over contexts 200-256, alike at 40)
constexpr int kDecodeKeyTile = 64;
constexpr int kQueryTile = 16;    // query rows per prefill work item
constexpr int kMaxDecodeRows = 4; // group heads per decode register block (4 x 128 fp32 accumulators)

struct Item {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin;  // query rows [q_begin, q_end) of the sequence's chunk
  int64_t q_end;
  int64_t cost;     // query rows x keys they read, for heaviest-first ordering
  int64_t kv_heads = 1;  // kv heads [kv_head, kv_head + kv_heads): a per-tier decode row takes them all
};

template <typename scalar_t>
struct Problem {
  const scalar_t* query;  // [T, Hq, D]
  const scalar_t* k_cache;  // [num_blocks, block_size, Hkv, D]
  const scalar_t* v_cache;
  scalar_t* out;  // [T, Hq, D]
  const int64_t* block_tables;  // [S, table_width]
  const int64_t* seq_lens;
  const int64_t* query_start_loc;
  int64_t table_width;
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int64_t sliding_window;  // keys a query sees, itself included; 0 = the whole context
  bool decode_fast_path;  // single-row items take attend_decode_item (AVX-512, avx512_decode_fits)
  bool bf16_dot;  // the decode fast path scores bf16 keys with vdpbf16ps (AVX-512 BF16)
  bool prefetch_next;  // the decode fast path prefetches the next tile's K/V rows while a tile computes
  bool chunked_claims;  // threads claim runs of items (ItemClaims), not one at a time
  bool tiered_decode;  // single-row items take the per-tier decode form (tiered/attention_decode.cpp)
};

// The keys a decode register block reads after the current one: the rest of the same item's keys, or
// the next item a thread has claimed. Only read for prefetching.
struct NextKeys {
  const int64_t* table;
  int64_t kv_head, first_key, num_keys;
};

// Whether the AVX-512 decode fast path (attend_decode_item) takes rows of this head_dim.
FOLO_INLINE bool avx512_decode_fits(int64_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

// First key position a query at ``pos`` sees.
FOLO_INLINE int64_t first_visible_key(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
}

// Below this many (query row x key) pairs in all, items run on the calling thread: waking a team
// costs more than it saves (a batch-1 decode step's 3 small items, say).
constexpr int64_t kSerialCost = 3 * 256;

// Per-thread scratch, sized for the largest item. ``rows`` = 0 when every item takes the decode fast
// path, which needs only the scores and the key offsets (zero-filling the rest costs more than a
// small decode call).
struct Workspace {
  std::vector<float> q, acc, scores, keys, values, row_max, row_sum;
  std::vector<const float*> key_rows, value_rows;
  std::vector<int64_t> offsets, ahead;  // ahead: the next tile's row offsets (prefetch_next)
  Workspace(int64_t rows, int64_t head_dim)
      : q(rows * head_dim), acc(rows * head_dim), scores(std::max<int64_t>(rows, kMaxDecodeRows) * kKeyTile),
        keys(rows ? kKeyTile * head_dim : 0), values(rows ? kKeyTile * head_dim : 0), row_max(rows),
        row_sum(rows), key_rows(rows ? kKeyTile : 0), value_rows(rows ? kKeyTile : 0), offsets(kKeyTile),
        ahead(kKeyTile) {}
};

// exp of n scores minus their running max (so every x <= 0), in place.
FOLO_INLINE void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = fast_exp(x[i]);
}

}  // namespace
}  // namespace folovllm::cpu
