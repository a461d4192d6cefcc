// The paged-attention kernel's decode form, built once per tier (csrc/cpu/vec.h): one query row, every head
// of one kv head's GQA group, over keys scattered in the cache's blocks. attention.cpp takes it below the
// AVX-512 tier (where its AVX-512 decode path runs instead), for any head_dim that is a multiple of kLanes;
// attention_quant.cpp takes it at every tier for a quantized cache (int8/fp8 codes widened and scaled as read).
//
// An item is one query row over one or more consecutive kv heads (attention.cpp gives a plain cache's decode
// row all of them): each tile reads a token's rows of every kv head together, one contiguous run of the cache
// per token instead of one 128-byte piece per kv head, and every head keeps its own sums and softmax state.
// Keys go in tiles of at most kTile: with look-ahead, the next tile's K/V rows (this item's, else the first
// of the item the thread runs next) are asked for into L2 a few lines per key while a tile computes, so
// memory streams them meanwhile (RowLines; without, each tile's rows are asked for at once as it starts).
// Each K and V vector is widened to fp32 in a register as it is read (bf16 shifted, int8/fp8 scaled) and used
// there by up to kHeadBlock heads of the group at once, so a row is read once per group of heads and never
// copied; four keys share one horizontal reduction, and each head's online softmax (running max, rescaled
// sums and accumulators) updates once per tile. Every sum runs in the order the earlier widen-into-a-buffer
// form used (along the row for a score, key by key for a value), so the results are the same bits.
// Accumulation is fp32 throughout.
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

constexpr int64_t kTile = 64;  // keys per online-softmax update
constexpr int kHeadBlock = 3;  // group heads that share each K/V row read: 3 x 4 sums fill the registers
constexpr int kValueVecs = 4;  // value vectors per head a pass keeps in registers

struct Scratch {
  std::vector<float> q, acc, scores, row_max, row_sum;
  std::vector<int64_t> offsets, ahead;
};

// The thread's scratch, grown to `heads` rows of `dim` (scores padded to whole vectors).
Scratch& scratch(int64_t heads, int64_t dim) {
  thread_local Scratch s;
  const size_t rows = static_cast<size_t>(heads * dim);
  if (s.q.size() < rows) s.q.resize(rows), s.acc.resize(rows);
  if (s.row_max.size() < static_cast<size_t>(heads)) s.row_max.resize(heads), s.row_sum.resize(heads);
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

// The K and V lines of n rows of a cache (offsets in elements of elem_bytes, span_bytes from each), asked for
// in row order, a few at a time: each time a score or value pass takes up a key, `per_visit` lines of K and as
// many of V. Used for the rows the thread reads next (the next tile's), into L2 (kHint = _MM_HINT_T1; the
// current tile's rows fill much of L1) while the current tile computes. The rows sit in scattered blocks;
// asked for all at once, a tile's hundreds of lines fill the core's miss buffers and its own loads queue behind
// them, so memory and arithmetic take turns instead of overlapping. Where nothing looks ahead, a tile's own
// rows are asked for into L1 at once as it starts (finish() right after start()).
template <auto kHint>
struct RowLines {
  const char* k = nullptr;
  const char* v = nullptr;
  const int64_t* offsets = nullptr;  // the rows' cache offsets, in elements of elem_bytes
  int64_t elem_bytes = 0, span_bytes = 0, byte = 0;  // byte: the next line's, from the start of row `row`
  int rows = 0, row = 0, per_visit = 0;

  void start(const PagedHead& kv, int64_t elem, int64_t span, const int64_t* offs, int n, int per) {
    k = static_cast<const char*>(kv.k);
    v = static_cast<const char*>(kv.v);
    offsets = offs, elem_bytes = elem, span_bytes = span, rows = n, per_visit = per, row = 0, byte = 0;
  }
  // Asks for the lines of `visits` key visits.
  FOLO_VINLINE void ask(int visits) {
    for (int i = visits * per_visit; i > 0 && row < rows; --i) {
      const int64_t at = offsets[row] * elem_bytes + byte;
      _mm_prefetch(k + at, kHint);
      _mm_prefetch(v + at, kHint);
      if ((byte += 64) >= span_bytes) byte = 0, ++row;
    }
  }
  // Asks for every line not asked for yet.
  void finish() {
    while (row < rows) ask(1);
  }
};
using RowsAhead = RowLines<_MM_HINT_T1>;

// Rows of a cache in the query's dtype: a row's vector at column d, fp32 as stored or bf16 widened in a register.
template <typename T>
struct PlainRows {
  static constexpr int64_t kElemBytes = sizeof(T);
  static int64_t row_bytes(int64_t dim) { return dim * kElemBytes; }
  struct Row {
    const T* p;
    FOLO_VINLINE Vec at(int64_t d) const { return load(p + d); }
  };
  FOLO_VINLINE Row operator()(const void* cache, int64_t offset, int64_t) const {
    return Row{static_cast<const T*>(cache) + offset};
  }
};

// Rows of a quantized cache (kv_quant.h): a row's codes at column d widened to fp32 in a register, times the
// row's scale.
template <KvFormat F>
struct QuantRows {
  static constexpr int64_t kElemBytes = 1;
  static int64_t row_bytes(int64_t dim) { return dim + kKvScaleBytes; }
  struct Row {
    const uint8_t* p;
    Vec scale;
    FOLO_VINLINE Vec at(int64_t d) const {
      if constexpr (F == KvFormat::kInt8) return vmul(vload_i8(reinterpret_cast<const int8_t*>(p) + d), scale);
      else return vmul(vload_byte_float(p + d, kv_fp8_shift(F)), scale);
    }
  };
  FOLO_VINLINE Row operator()(const void* cache, int64_t offset, int64_t dim) const {
    const uint8_t* row = static_cast<const uint8_t*>(cache) + offset;
    if constexpr (F == KvFormat::kInt8) return Row{row, vset1(kv_row_scale(row, dim))};
    else return Row{row, vset1(kv_row_scale(row, dim) * kv_fp8_factor(F))};
  }
};

// Scores of keys [j0, j0 + J) for heads [h0, h0 + H) (q rows already scaled, a head's scores at
// scores + h * stride): each key's row is read once for all H heads, and each sum runs along the row in
// order; four keys share one horizontal reduction.
template <int H, int J, typename Row>
FOLO_VINLINE void score_block(const float* q, int64_t dim, const Row* keys, int j0, float* scores, int64_t stride) {
  Vec part[H][J];
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < J; ++i) part[h][i] = vzero();
  for (int64_t d = 0; d < dim; d += kLanes) {
    Vec qv[H];
    for (int h = 0; h < H; ++h) qv[h] = vload(q + h * dim + d);
    for (int i = 0; i < J; ++i) {
      const Vec kv = keys[j0 + i].at(d);
      for (int h = 0; h < H; ++h) part[h][i] = vfma(qv[h], kv, part[h][i]);
    }
  }
  for (int h = 0; h < H; ++h) {
    if constexpr (J == 4) {
      vsum4(part[h][0], part[h][1], part[h][2], part[h][3], scores + h * stride + j0);
    } else {
      for (int i = 0; i < J; ++i) scores[h * stride + j0 + i] = vhsum(part[h][i]);
    }
  }
}

// The tile's n scores for heads [h0, h0 + H): four keys at a time, then one by one.
template <int H, typename Row>
FOLO_VINLINE void score_heads(const float* q, int64_t dim, const Row* keys, int n, float* scores, int64_t stride,
                              RowsAhead& ahead) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    ahead.ask(4);
    score_block<H, 4>(q, dim, keys, j, scores, stride);
  }
  for (; j < n; ++j) {
    ahead.ask(1);
    score_block<H, 1>(q, dim, keys, j, scores, stride);
  }
}

// acc[h][c] += sum over the tile's keys j of w[h][j] * v_j[c], heads [h0, h0 + H), C vectors from column d0
// (kept in registers; each value row read once for all H heads).
template <int H, int C, typename Row>
FOLO_VINLINE void value_block(float* acc, int64_t dim, const float* w, int64_t stride, const Row* values, int n,
                              int64_t d0, RowsAhead& ahead) {
  Vec sum[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) sum[h][c] = vload(acc + h * dim + d0 + c * kLanes);
  for (int j = 0; j < n; ++j) {
    ahead.ask(1);
    Vec wj[H];
    for (int h = 0; h < H; ++h) wj[h] = vbroadcast(w + h * stride + j);
    for (int c = 0; c < C; ++c) {
      const Vec vv = values[j].at(d0 + c * kLanes);
      for (int h = 0; h < H; ++h) sum[h][c] = vfma(wj[h], vv, sum[h][c]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) vstore(acc + h * dim + d0 + c * kLanes, sum[h][c]);
}

template <int H, typename Row>
FOLO_VINLINE void value_heads(float* acc, int64_t dim, const float* w, int64_t stride, const Row* values, int n,
                              RowsAhead& ahead) {
  int64_t d0 = 0;
  for (; d0 + kValueVecs * kLanes <= dim; d0 += kValueVecs * kLanes) {
    value_block<H, kValueVecs>(acc, dim, w, stride, values, n, d0, ahead);
  }
  for (; d0 < dim; d0 += kLanes) value_block<H, 1>(acc, dim, w, stride, values, n, d0, ahead);
}

// Heads [0, heads) in groups of up to kHeadBlock: fn(std::integral_constant<int, H>, h0).
template <typename Fn>
FOLO_VINLINE void by_head_groups(int64_t heads, Fn&& fn) {
  int64_t h = 0;
  for (; h + kHeadBlock <= heads; h += kHeadBlock) fn(std::integral_constant<int, kHeadBlock>{}, h);
  if (heads - h == 2) fn(std::integral_constant<int, 2>{}, h);
  if (heads - h == 1) fn(std::integral_constant<int, 1>{}, h);
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

// Rows: how K/V rows are read as fp32 (PlainRows<T>, QuantRows<F>).
// kv_heads consecutive kv heads (rows head_stride elements apart), `group` query heads each.
template <typename T, typename Rows>
void decode(const T* query, T* out, int64_t kv_heads, int64_t group, int64_t head_stride, int64_t dim, float scale,
            const PagedHead& kv, int64_t first_key, int64_t num_keys, const PagedHead* next, int64_t next_first,
            int64_t next_end) {
  const int64_t heads = kv_heads * group;
  Scratch& s = scratch(heads, dim);
  const Rows read_row{};
  const int64_t span_bytes = (kv_heads - 1) * head_stride * Rows::kElemBytes + Rows::row_bytes(dim);  // a token's rows
  const int64_t stride = kTile + kLanes;  // a head's score row
  // lines of K (and as many of V) asked for per key visit: a tile's score and value passes visit each key at
  // least 2 x kv_heads times, so the next tile's lines are all asked for by the end of this one's arithmetic
  const int per_visit = static_cast<int>(((span_bytes + 63) / 64 + 2 * kv_heads - 1) / (2 * kv_heads));
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
  typename Rows::Row rows[kTile];
  const int64_t tile = tile_size(num_keys - first_key);
  for (int64_t t0 = first_key; t0 < num_keys; t0 += tile) {
    const int n = tile_offsets(kv, t0, std::min(t0 + tile, num_keys), s.offsets.data());
    RowsAhead ahead;  // empty: asks for nothing
    if (next == nullptr) {  // no look-ahead: this tile's rows, all asked for at once
      RowLines<_MM_HINT_T0> now;
      now.start(kv, Rows::kElemBytes, span_bytes, s.offsets.data(), n, per_visit);
      now.finish();
    } else if (t0 + tile < num_keys) {  // this item's next tile
      const int64_t t1 = t0 + tile;
      ahead.start(kv, Rows::kElemBytes, span_bytes, s.ahead.data(),
                  tile_offsets(kv, t1, std::min(t1 + tile, num_keys), s.ahead.data()), per_visit);
    } else if (next_first < next_end) {  // the first tile of the item this thread runs next
      const int64_t t1 = std::min(next_first + tile_size(next_end - next_first), next_end);
      ahead.start(*next, Rows::kElemBytes, span_bytes, s.ahead.data(),
                  tile_offsets(*next, next_first, t1, s.ahead.data()), per_visit);
    }
    for (int64_t g = 0; g < kv_heads; ++g) {
      for (int j = 0; j < n; ++j) rows[j] = read_row(kv.k, s.offsets[j] + g * head_stride, dim);
      by_head_groups(group, [&](auto block, int64_t h) {
        const int64_t h0 = g * group + h;
        score_heads<decltype(block)::value>(&s.q[h0 * dim], dim, rows, n, &s.scores[h0 * stride], stride, ahead);
      });
    }
    const int padded = (n + kLanes - 1) / kLanes * kLanes;
    for (int64_t r = 0; r < heads; ++r) {
      float* sc = &s.scores[r * stride];
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
    for (int64_t g = 0; g < kv_heads; ++g) {
      for (int j = 0; j < n; ++j) rows[j] = read_row(kv.v, s.offsets[j] + g * head_stride, dim);
      by_head_groups(group, [&](auto block, int64_t h) {
        const int64_t h0 = g * group + h;
        value_heads<decltype(block)::value>(&s.acc[h0 * dim], dim, &s.scores[h0 * stride], stride, rows, n, ahead);
      });
    }
    ahead.finish();
  }
  for (int64_t r = 0; r < heads; ++r) {
    const Vec inv = vset1(1.f / row_sum[r]);
    for (int64_t d = 0; d < dim; d += kLanes) store(out + r * dim + d, vmul(vload(&s.acc[r * dim + d]), inv));
  }
}

}  // namespace

void decode_attention(const void* query, void* out, bool bf16, int64_t kv_heads, int64_t heads, int64_t dim,
                      float scale, const PagedHead& kv, int64_t first_key, int64_t num_keys, const PagedHead* next,
                      int64_t next_first, int64_t next_end) {
  if (bf16) {
    decode<uint16_t, PlainRows<uint16_t>>(static_cast<const uint16_t*>(query), static_cast<uint16_t*>(out), kv_heads,
                                          heads, dim, dim, scale, kv, first_key, num_keys, next, next_first, next_end);
  } else {
    decode<float, PlainRows<float>>(static_cast<const float*>(query), static_cast<float*>(out), kv_heads, heads, dim,
                                    dim, scale, kv, first_key, num_keys, next, next_first, next_end);
  }
}

void decode_attention_quantized(const void* query, void* out, bool bf16, int64_t heads, int64_t dim, float scale,
                                const PagedHead& kv, int format, int64_t first_key, int64_t num_keys) {
  auto run = [&](auto rows) {
    using Rows = decltype(rows);
    if (bf16) {
      decode<uint16_t, Rows>(static_cast<const uint16_t*>(query), static_cast<uint16_t*>(out), 1, heads, 0, dim,
                             scale, kv, first_key, num_keys, nullptr, 0, 0);
    } else {
      decode<float, Rows>(static_cast<const float*>(query), static_cast<float*>(out), 1, heads, 0, dim, scale, kv,
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
