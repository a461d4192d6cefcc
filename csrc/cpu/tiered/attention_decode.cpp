// The paged-attention kernel's decode form, built once per tier (csrc/cpu/vec.h): one query row, every head
// of one kv head's GQA group, over keys scattered in the cache's blocks. attention.cpp takes it below the
// AVX-512 tier (where its AVX-512 decode path runs instead), for any head_dim that is a multiple of kLanes;
// attention_quant.cpp takes it at every tier for a quantized cache (int8/fp8 codes widened and scaled as read).
//
// Keys go in tiles of at most kTile: with look-ahead, the next tile's K/V rows (this item's, else the first
// of the item the thread runs next) are asked for while a tile computes, so memory streams them meanwhile
// (without, each tile's rows are asked for at once as it starts); bf16 rows are widened once into an fp32 tile that every
// head of the group then reads, four keys share one horizontal reduction, and each head's online softmax
// (running max, rescaled sums and accumulators) updates once per tile. Accumulation is fp32 throughout.
#include "../kv_quant.h"
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kTile = 64;  // keys per online-softmax update: a bf16 tile's widened K and V stay in L1
constexpr int kAccVecs = 8;    // accumulator vectors a head keeps in registers while it sums a tile's values

struct Scratch {
  std::vector<float> q, acc, scores, keys, values, row_max, row_sum;
  std::vector<int64_t> offsets, ahead;
};

// The thread's scratch, grown to `heads` rows of `dim` (scores padded to whole vectors).
Scratch& scratch(int64_t heads, int64_t dim) {
  thread_local Scratch s;
  const size_t rows = static_cast<size_t>(heads * dim), tile = static_cast<size_t>(kTile * dim);
  if (s.q.size() < rows) s.q.resize(rows), s.acc.resize(rows);
  if (s.row_max.size() < static_cast<size_t>(heads)) s.row_max.resize(heads), s.row_sum.resize(heads);
  if (s.keys.size() < tile) s.keys.resize(tile), s.values.resize(tile);
  const size_t scores = static_cast<size_t>(heads * (kTile + kLanes));
  if (s.scores.size() < scores) s.scores.resize(scores);
  if (s.offsets.empty()) s.offsets.resize(kTile), s.ahead.resize(kTile);
  return s;
}

FOLO_VINLINE Vec load(const float* p) { return vload(p); }
FOLO_VINLINE Vec load(const uint16_t* p) { return vload_bf16(p); }
FOLO_VINLINE void store(float* p, Vec v) { vstore(p, v); }
FOLO_VINLINE void store(uint16_t* p, Vec v) { vstore_bf16(p, v); }

// Keys per tile for `keys` keys: as few tiles as kTile allows, of equal size (no short last tile).
FOLO_VINLINE int64_t tile_size(int64_t keys) {
  const int64_t tiles = (keys + kTile - 1) / kTile;
  return (keys + tiles - 1) / tiles;
}

// Cache offsets of keys [t0, t1) of `kv`, walking the block table from t0's block.
int tile_offsets(const PagedHead& kv, int64_t t0, int64_t t1, int64_t* offsets) {
  int64_t block = t0 / kv.block_size, in_block = t0 % kv.block_size;
  for (int64_t t = t0; t < t1; ++t) {
    offsets[t - t0] = (kv.table[block] * kv.block_size + in_block) * kv.token_stride + kv.offset;
    if (++in_block == kv.block_size) {
      in_block = 0;
      ++block;
    }
  }
  return static_cast<int>(t1 - t0);
}

// Asks for the K and V lines of n rows (cache offsets, in elements of `elem_bytes`) of `kv`: they sit in
// scattered blocks, so asking for a tile's rows while the tile before it computes overlaps their memory
// latencies with that work.
void prefetch_rows(const PagedHead& kv, int64_t elem_bytes, int64_t row_bytes, const int64_t* offsets, int n) {
  const char* k = static_cast<const char*>(kv.k);
  const char* v = static_cast<const char*>(kv.v);
  for (int j = 0; j < n; ++j)
    for (int64_t b = 0; b < row_bytes; b += 64) {
      _mm_prefetch(k + offsets[j] * elem_bytes + b, _MM_HINT_T0);
      _mm_prefetch(v + offsets[j] * elem_bytes + b, _MM_HINT_T0);
    }
}

// Rows of a cache in the query's dtype: fp32 read in place, bf16 widened into `buf` (row j).
template <typename T>
struct PlainRows {
  static constexpr int64_t kElemBytes = sizeof(T);
  static int64_t row_bytes(int64_t dim) { return dim * kElemBytes; }
  FOLO_VINLINE const float* operator()(const void* cache, int64_t offset, int64_t dim, float* buf, int j) const {
    const T* row = static_cast<const T*>(cache) + offset;
    if constexpr (std::is_same_v<T, float>) {
      return row;
    } else {
      float* out = buf + j * dim;
      for (int64_t d = 0; d < dim; d += kLanes) vstore(out + d, vload_bf16(row + d));
      return out;
    }
  }
};

// Rows of a quantized cache (kv_quant.h): codes widened to fp32 in registers, times the row's scale, into `buf`.
template <KvFormat F>
struct QuantRows {
  static constexpr int64_t kElemBytes = 1;
  static int64_t row_bytes(int64_t dim) { return dim + kKvScaleBytes; }
  FOLO_VINLINE const float* operator()(const void* cache, int64_t offset, int64_t dim, float* buf, int j) const {
    const uint8_t* row = static_cast<const uint8_t*>(cache) + offset;
    float* out = buf + j * dim;
    if constexpr (F == KvFormat::kInt8) {
      const Vec scale = vset1(kv_row_scale(row, dim));
      for (int64_t d = 0; d < dim; d += kLanes)
        vstore(out + d, vmul(vload_i8(reinterpret_cast<const int8_t*>(row) + d), scale));
    } else {
      const Vec scale = vset1(kv_row_scale(row, dim) * kv_fp8_factor(F));
      for (int64_t d = 0; d < dim; d += kLanes) vstore(out + d, vmul(vload_byte_float(row + d, kv_fp8_shift(F)), scale));
    }
    return out;
  }
};

// scores[j] = q . k_j for keys [j0, j0 + G) (q already scaled): G independent sums, so the FMAs of G keys
// overlap instead of each waiting on the last; G/4 horizontal reductions.
template <int G>
FOLO_VINLINE void score_keys(const float* q, const float* const* keys, int j0, int64_t dim, float* scores) {
  Vec part[G];
  for (int i = 0; i < G; ++i) part[i] = vzero();
  for (int64_t d = 0; d < dim; d += kLanes) {
    const Vec qv = vload(q + d);
    for (int i = 0; i < G; ++i) part[i] = vfma(qv, vload(keys[j0 + i] + d), part[i]);
  }
  for (int i = 0; i < G; i += 4) vsum4(part[i], part[i + 1], part[i + 2], part[i + 3], scores + j0 + i);
}

// The tile's n scores: eight keys at a time, then four, then one by one.
FOLO_VINLINE void score_tile(const float* q, const float* const* keys, int n, int64_t dim, float* scores) {
  int j = 0;
  for (; j + 8 <= n; j += 8) score_keys<8>(q, keys, j, dim, scores);
  for (; j + 4 <= n; j += 4) score_keys<4>(q, keys, j, dim, scores);
  for (; j < n; ++j) {
    Vec part = vzero();
    for (int64_t d = 0; d < dim; d += kLanes) part = vfma(vload(q + d), vload(keys[j] + d), part);
    scores[j] = vhsum(part);
  }
}

// exp(s - shift) in place over n scores padded to whole vectors with -inf (which give 0); returns the sum.
FOLO_VINLINE float exp_shifted_sum(float* s, int n, float shift) {
  const Vec minus = vset1(-shift);  // x + (-shift) is x - shift exactly
  Vec total = vzero();
  for (int j = 0; j < n; j += kLanes) {
    const Vec e = vexp(vadd(vload(s + j), minus));
    vstore(s + j, e);
    total = vadd(total, e);
  }
  return vhsum(total);
}

// acc[c] += sum over the tile's keys j of w[j] * v_j[c], for C vectors from column d0 (kept in registers).
template <int C>
FOLO_VINLINE void add_values(float* acc, const float* w, const float* const* values, int n, int64_t d0) {
  Vec sum[C];
  for (int c = 0; c < C; ++c) sum[c] = vload(acc + d0 + c * kLanes);
  for (int j = 0; j < n; ++j) {
    const Vec wj = vbroadcast(w + j);
    for (int c = 0; c < C; ++c) sum[c] = vfma(wj, vload(values[j] + d0 + c * kLanes), sum[c]);
  }
  for (int c = 0; c < C; ++c) vstore(acc + d0 + c * kLanes, sum[c]);
}

// Rows: how K/V rows are read as fp32 (PlainRows<T>, QuantRows<F>).
template <typename T, typename Rows>
void decode(const T* query, T* out, int64_t heads, int64_t dim, float scale, const PagedHead& kv, int64_t first_key,
            int64_t num_keys, const PagedHead* next, int64_t next_first, int64_t next_end) {
  Scratch& s = scratch(heads, dim);
  const Rows read_row{};
  const int64_t row_bytes = Rows::row_bytes(dim);
  const int64_t stride = kTile + kLanes;  // a head's score row
  float* row_max = s.row_max.data();
  float* row_sum = s.row_sum.data();
  for (int64_t r = 0; r < heads; ++r) {
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
    for (int64_t d = 0; d < dim; d += kLanes) {
      vstore(&s.q[r * dim + d], vmul(load(query + r * dim + d), vset1(scale)));
      vstore(&s.acc[r * dim + d], vzero());
    }
  }
  const float* rows[kTile];
  const int64_t tile = tile_size(num_keys - first_key);
  for (int64_t t0 = first_key; t0 < num_keys; t0 += tile) {
    const int n = tile_offsets(kv, t0, std::min(t0 + tile, num_keys), s.offsets.data());
    if (next == nullptr) {  // no look-ahead: this tile's rows, all asked for at once
      prefetch_rows(kv, Rows::kElemBytes, row_bytes, s.offsets.data(), n);
    } else if (t0 + tile < num_keys) {  // this item's next tile
      const int64_t t1 = t0 + tile;
      prefetch_rows(kv, Rows::kElemBytes, row_bytes, s.ahead.data(),
                    tile_offsets(kv, t1, std::min(t1 + tile, num_keys), s.ahead.data()));
    } else if (next_first < next_end) {  // the first tile of the item this thread runs next
      const int64_t t1 = std::min(next_first + tile_size(next_end - next_first), next_end);
      prefetch_rows(*next, Rows::kElemBytes, row_bytes, s.ahead.data(), tile_offsets(*next, next_first, t1, s.ahead.data()));
    }
    for (int j = 0; j < n; ++j) rows[j] = read_row(kv.k, s.offsets[j], dim, s.keys.data(), j);
    const int padded = (n + kLanes - 1) / kLanes * kLanes;
    for (int64_t r = 0; r < heads; ++r) {
      float* sc = &s.scores[r * stride];
      score_tile(&s.q[r * dim], rows, n, dim, sc);
      std::fill(sc + n, sc + padded, -std::numeric_limits<float>::infinity());
      Vec m = vset1(-std::numeric_limits<float>::infinity());
      for (int j = 0; j < padded; j += kLanes) m = vmax(m, vload(sc + j));
      const float new_max = std::max(row_max[r], vhmax(m));
      const float correction = std::exp(row_max[r] - new_max);
      row_max[r] = new_max;
      row_sum[r] = row_sum[r] * correction + exp_shifted_sum(sc, padded, new_max);
      if (correction != 1.f)
        for (int64_t d = 0; d < dim; d += kLanes)
          vstore(&s.acc[r * dim + d], vmul(vload(&s.acc[r * dim + d]), vset1(correction)));
    }
    for (int j = 0; j < n; ++j) rows[j] = read_row(kv.v, s.offsets[j], dim, s.values.data(), j);
    for (int64_t r = 0; r < heads; ++r) {
      float* acc = &s.acc[r * dim];
      const float* w = &s.scores[r * stride];
      int64_t d0 = 0;
      for (; d0 + kAccVecs * kLanes <= dim; d0 += kAccVecs * kLanes) add_values<kAccVecs>(acc, w, rows, n, d0);
      for (; d0 < dim; d0 += kLanes) add_values<1>(acc, w, rows, n, d0);
    }
  }
  for (int64_t r = 0; r < heads; ++r) {
    const Vec inv = vset1(1.f / row_sum[r]);
    for (int64_t d = 0; d < dim; d += kLanes) store(out + r * dim + d, vmul(vload(&s.acc[r * dim + d]), inv));
  }
}

}  // namespace

void decode_attention(const void* query, void* out, bool bf16, int64_t heads, int64_t dim, float scale,
                      const PagedHead& kv, int64_t first_key, int64_t num_keys, const PagedHead* next,
                      int64_t next_first, int64_t next_end) {
  if (bf16) {
    decode<uint16_t, PlainRows<uint16_t>>(static_cast<const uint16_t*>(query), static_cast<uint16_t*>(out), heads,
                                          dim, scale, kv, first_key, num_keys, next, next_first, next_end);
  } else {
    decode<float, PlainRows<float>>(static_cast<const float*>(query), static_cast<float*>(out), heads, dim, scale,
                                    kv, first_key, num_keys, next, next_first, next_end);
  }
}

void decode_attention_quantized(const void* query, void* out, bool bf16, int64_t heads, int64_t dim, float scale,
                                const PagedHead& kv, int format, int64_t first_key, int64_t num_keys) {
  auto run = [&](auto rows) {
    using Rows = decltype(rows);
    if (bf16) {
      decode<uint16_t, Rows>(static_cast<const uint16_t*>(query), static_cast<uint16_t*>(out), heads, dim, scale,
                             kv, first_key, num_keys, nullptr, 0, 0);
    } else {
      decode<float, Rows>(static_cast<const float*>(query), static_cast<float*>(out), heads, dim, scale, kv,
                          first_key, num_keys, nullptr, 0, 0);
    }
  };
  switch (static_cast<KvFormat>(format)) {
    case KvFormat::kInt8: return run(QuantRows<KvFormat::kInt8>{});
    case KvFormat::kFp8E4m3: return run(QuantRows<KvFormat::kFp8E4m3>{});
    case KvFormat::kFp8E5m2: return run(QuantRows<KvFormat::kFp8E5m2>{});
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
