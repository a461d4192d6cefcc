// The linear kernel's fp32 form, built once per tier (avx2, avx512: csrc/cpu/vec.h): y = x W^T with W held
// as bf16 in memory, packed as the AVX-512 BF16 form packs it ([N/64][K/2][64 rows][2]: each K pair of 64
// output rows is one 256-byte run), x in fp32. Each bf16 pair widens to fp32 in registers (a shift, a mask)
// and meets broadcast activations in FMAs into fp32 accumulators, so a decode step streams half the bytes
// an fp32 weight would and no instruction set beyond AVX2 + FMA is needed.
//
// A tile is R input rows times C vectors of a block's 64 output rows; every output's sum runs along K in
// the same order (k = 0, 1, 2, ... one FMA each) whatever the tile, so a row's result does not depend on
// its batch. Tiles fill the registers: AVX2 (16 ymm) one row x the whole block, up to 3 rows x half of it,
// 6 rows x a quarter; AVX-512 (32 zmm) up to 6 rows x the whole block. A chunk of 12 rows or more (a
// prefill, a large batch) widens each panel of its block to fp32 into a scratch buffer as its first row
// group reads it, and its other row groups run the classic broadcast-FMA tile over that buffer, so the
// widening is paid once per chunk, not once per row group. On AVX2 each thread first copies its chunk's rows
// as fp32 grouped the way the tiles take them (linear_group_rows), so a tile's broadcasts are one stream.
// Work items are a block times a chunk of up to 128 rows, or, for 12 rows or more, one panel of a block (a
// quarter on AVX2), so a weight of few blocks still splits evenly over the threads; on AVX2 a chunk's last
// 1-3 rows then take the whole block apart, where they have sums enough to keep the FMAs busy. Threads claim
// runs of items as they go (ItemClaims); the first tile of an item pulls the thread's next item into L2, so
// that one does not start waiting on memory.
// linear_argmax keeps each row's best output instead of writing them (a greedy LM head).
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kBlockRows = 64;                    // output rows per packed block
constexpr int kBlockVecs = kBlockRows / kLanes;       // vectors per block row-pair
constexpr int kMaxRows = 6;                           // input rows per tile
constexpr int64_t kChunkRows = 128;                   // input rows per work item
constexpr int64_t kPrefetchPairs = 32;                // K pairs read ahead (8 KiB of a block; 2 KiB: 4-6 % slower at 32 rows on AVX2)

constexpr int64_t kPanelRows = 12;                    // rows from which a chunk widens its weights once
// AVX2's tiles take x grouped (linear_group_rows): 2 output vectors a row, so broadcasts are half the loads
// and one stream of them pays; AVX-512's (4 vectors a row) read x's own rows: grouping there only costs the copy.
constexpr bool kGroupedRows = kLanes == 8;

// Output vectors per tile for R rows: as many as the registers hold beside R x C accumulators.
template <int R>
constexpr int tile_vecs() {
  if (kLanes == 16) return kBlockVecs;  // AVX-512: 6 x 4 accumulators + the weights and a broadcast
  return R == 1 ? 8 : R <= 3 ? 4 : 2;   // AVX2: at most 12 accumulators
}
constexpr int kPanelVecs = tile_vecs<kMaxRows>();  // width of a widened panel, in vectors
constexpr int kPanels = kBlockVecs / kPanelVecs;   // panels per block

// Work items per block and chunk of rows: a chunk of kPanelRows rows or more splits each block into its
// panels (AVX2: 4), so a weight of few blocks still spreads evenly over the threads (a 576-row weight
// is 9 blocks: 5 and 4 items on two threads, but 18 and 18 panels). On AVX2 a chunk's last row group of 1-3
// rows (rest_rows) gets one more item, the whole block in packed tiles of tile_vecs<R>() vectors (8-12 sums):
// over one panel it would keep 2-6 sums, too few to cover the FMA latency (2 rows: half the FMA rate).
constexpr bool kRestApart = kLanes == 8;
int64_t rest_rows(int64_t rows) {  // rows of a chunk of `rows` that its block's rest item takes
  const int64_t rest = rows % kMaxRows;
  return kRestApart && rows >= kPanelRows && rest <= 3 ? rest : 0;
}
// Whether some chunk of M rows has a rest of its own (full chunks have kChunkRows % kMaxRows rows left over).
bool has_rest(int64_t M) {
  return M >= kPanelRows && (rest_rows(M % kChunkRows) > 0 || (M >= kChunkRows && rest_rows(kChunkRows) > 0));
}
int64_t items_per_block(int64_t M) { return M >= kPanelRows ? kPanels + has_rest(M) : 1; }

// The weights a tile reads, pair p, vector c: straight from the packed bf16 block (widened in registers as
// read), or from a panel of it widened to fp32 once ([pair][even, odd][kPanelVecs vectors]) for a chunk of
// many rows. Either way each FMA meets the same fp32 value, so both give the same bits.
struct Packed {
  const uint32_t* wb;
  int v0;
  FOLO_VINLINE Vec half(int64_t p, int c, int h) const {  // h = 0: w[2p], 1: w[2p + 1]
    const VecI w = vload_i(wb + p * kBlockRows + (v0 + c) * kLanes);
    return h == 0 ? bf16_even(w) : bf16_odd(w);
  }
  FOLO_VINLINE void prefetch(int64_t p) const {
    _mm_prefetch(reinterpret_cast<const char*>(wb + p * kBlockRows + v0 * kLanes), _MM_HINT_T0);
  }
};
struct Panel {
  const float* panel;
  FOLO_VINLINE Vec half(int64_t p, int c, int h) const { return vload(panel + ((2 * p + h) * kPanelVecs + c) * kLanes); }
  FOLO_VINLINE void prefetch(int64_t) const {}
};
// The packed block read as it goes, each widened vector also stored into the panel: a chunk's first row
// group widens the panel that its other row groups then read, with no pass of its own.
struct WidenInto {
  Packed packed;
  float* panel;
  FOLO_VINLINE Vec half(int64_t p, int c, int h) const {
    const Vec v = packed.half(p, c, h);
    vstore(panel + ((2 * p + h) * kPanelVecs + c) * kLanes, v);
    return v;
  }
  FOLO_VINLINE void prefetch(int64_t p) const { packed.prefetch(p); }
};

template <typename Fn>
FOLO_VINLINE void by_row_groups(int64_t first, int64_t last, Fn&& fn) {
  int64_t m = first;
  for (; m + kMaxRows <= last; m += kMaxRows) fn(std::integral_constant<int, kMaxRows>{}, m);
  switch (last - m) {
    case 1: fn(std::integral_constant<int, 1>{}, m); break;
    case 2: fn(std::integral_constant<int, 2>{}, m); break;
    case 3: fn(std::integral_constant<int, 3>{}, m); break;
    case 4: fn(std::integral_constant<int, 4>{}, m); break;
    case 5: fn(std::integral_constant<int, 5>{}, m); break;
    default: break;
  }
}

// n bf16 values widened to fp32 (exact).
void widen_bf16(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload_bf16(src + i));
  for (; i < n; ++i) dst[i] = bf16_scalar(src[i]);
}

}  // namespace

// Rows [first, last) of x (fp32, or bf16 widened: exact) into `out` as the tiles read them. On AVX2 grouped as
// by_row_groups groups them: the group of R rows that starts at row m lies at out + (m - first) K as
// [K pair][R rows][2], so a tile's broadcasts read one stream rather than R rows K apart (1-9 % faster at
// 32-2,048 rows in alternating kernel rounds); elsewhere row after row. The values, and so the bits, are x's own.
void linear_group_rows(const LinearIn& x, int64_t K, int64_t first, int64_t last, float* out) {
  if constexpr (!kGroupedRows) {
    if (x.f32 != nullptr) {
      std::memcpy(out, x.f32 + first * K, (last - first) * K * sizeof(float));
    } else {
      widen_bf16(x.bf16 + first * K, (last - first) * K, out);
    }
    return;
  }
  thread_local std::vector<float> widened;  // a group's bf16 rows as fp32
  if (x.f32 == nullptr && static_cast<int64_t>(widened.size()) < kMaxRows * K) widened.resize(kMaxRows * K);
  const int64_t pairs = K / 2;
  by_row_groups(first, last, [&](auto rows, int64_t m) {
    constexpr int R = decltype(rows)::value;
    if (x.f32 == nullptr) widen_bf16(x.bf16 + m * K, R * K, widened.data());
    const float* src = x.f32 != nullptr ? x.f32 + m * K : widened.data();  // the group's R rows, K apart
    char* group = reinterpret_cast<char*>(out + (m - first) * K);
    for (int64_t p = 0; p < pairs; ++p)  // written in order, one K pair (8 bytes) of each row at a time
      for (int r = 0; r < R; ++r) std::memcpy(group + (p * R + r) * 8, src + r * K + 2 * p, 8);
  });
}

namespace {

// Rows [first, last) of x as the tiles read them: x's own fp32 rows where they are, else grouped or widened
// (linear_group_rows) into this thread's scratch.
const float* tile_rows(const LinearIn& x, int64_t K, int64_t first, int64_t last) {
  if (!kGroupedRows && x.f32 != nullptr) return x.f32 + first * K;
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < (last - first) * K) scratch.resize((last - first) * K);
  linear_group_rows(x, K, first, last, scratch.data());
  return scratch.data();
}

// A chunk's scratch for one panel: pairs x 2 x kPanelVecs vectors, per thread, grown as needed.
float* panel_scratch(int64_t pairs) {
  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(pairs) * 2 * kPanelVecs * kLanes;
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

// Where a tile over a group of R rows (linear_group_rows' layout) finds row r's x[2p + h].
template <int R>
FOLO_VINLINE const float* x_at(const float* x, int64_t K, int r, int64_t p, int h) {
  return kGroupedRows ? x + p * (2 * R) + 2 * r + h : x + r * K + 2 * p + h;
}

// A group of R rows of x times C weight vectors: acc[r][c] = sum over k of x[r][k] w[k][col]; `next` pulled
// into L2 on the way.
// (The sums run in a local array, copied out at the end: gcc keeps that one in registers, where an output
// array's elements would go back to memory on every pair.)
template <int R, int C, typename Weights>
FOLO_VINLINE void tile(const float* x, int64_t K, int64_t pairs, const Weights& w, const NextWeights& next,
                       Vec (&out)[R][C]) {
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (int64_t p = 0; p < pairs; ++p) {
    if (p + kPrefetchPairs < pairs) w.prefetch(p + kPrefetchPairs);
    next.prefetch(p);
    if constexpr (R <= 2) {  // few rows: each weight vector read once, both its halves used at once
      for (int c = 0; c < C; ++c) {
        const Vec even = w.half(p, c, 0), odd = w.half(p, c, 1);
        for (int r = 0; r < R; ++r) {
          acc[r][c] = vfma(vbroadcast(x_at<R>(x, K, r, p, 0)), even, acc[r][c]);
          acc[r][c] = vfma(vbroadcast(x_at<R>(x, K, r, p, 1)), odd, acc[r][c]);
        }
      }
      continue;
    }
    for (int h = 0; h < 2; ++h) {  // k = 2p, then 2p + 1: C weight vectors, then one broadcast per row
      Vec wv[C];
      for (int c = 0; c < C; ++c) wv[c] = w.half(p, c, h);
      for (int r = 0; r < R; ++r) {
        const Vec xr = vbroadcast(x_at<R>(x, K, r, p, h));
        for (int c = 0; c < C; ++c) acc[r][c] = vfma(xr, wv[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

// y rows [row0, row0 + R) at columns [col, col + C kLanes): the sums plus the bias, stored as fp32 or bf16.
template <int R, int C>
FOLO_VINLINE void store_tile(const Vec (&acc)[R][C], const float* bias, const LinearOut& out, int64_t row0,
                             int64_t col0) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int64_t col = col0 + c * kLanes;
      Vec v = acc[r][c];
      if (bias != nullptr) v = vadd(v, vload(bias + col));
      const int64_t at = (row0 + r) * out.N + col;
      if (out.f32 != nullptr) {
        vstore(out.f32 + at, v);
      } else {
        vstore_bf16(out.bf16 + at, v);
      }
    }
}

// Rows [first, last) of x (laid out from row `first` as linear_group_rows lays them) times panels [q0, q1) of
// block `wb` (kPanelVecs vectors each), tile by tile in increasing columns for each row: consume(acc, m, v0)
// gets the sums of rows [m, m + R) at the block's vectors [v0, v0 + C). Few rows times the whole block read
// the packed block as they go; otherwise each panel is widened once and the rows run over it. The first tile
// pulls `next` into L2.
template <typename Consume>
FOLO_VINLINE void packed_tiles(const float* x, int64_t K, int64_t pairs, const uint32_t* wb, int64_t first,
                               int64_t last, NextWeights next, Consume&& consume) {
  by_row_groups(first, last, [&](auto rows, int64_t m) {
    constexpr int R = decltype(rows)::value, C = tile_vecs<R>();
    for (int v0 = 0; v0 < kBlockVecs; v0 += C) {
      Vec acc[R][C];
      tile<R, C>(x + (m - first) * K, K, pairs, Packed{wb, v0}, next, acc);
      next = {};
      consume(acc, m, v0);
    }
  });
}

template <typename Consume>
FOLO_VINLINE void block_tiles(const float* x, int64_t K, int64_t pairs, const uint32_t* wb, int64_t first,
                              int64_t last, int q0, int q1, NextWeights next, Consume&& consume) {
  const bool whole = q0 == 0 && q1 == kPanels;
  if (last - first < kPanelRows && whole) return packed_tiles(x, K, pairs, wb, first, last, next, consume);
  if (const int64_t rest = whole ? rest_rows(last - first) : 0; rest > 0) {
    packed_tiles(x + (last - rest - first) * K, K, pairs, wb, last - rest, last, next, consume);
    last -= rest, next = {};
  }
  float* panel = panel_scratch(pairs);
  for (int v0 = q0 * kPanelVecs; v0 < q1 * kPanelVecs; v0 += kPanelVecs) {
    bool widened = false;  // the first row group widens the panel as it reads the block
    by_row_groups(first, last, [&](auto rows, int64_t m) {
      constexpr int R = decltype(rows)::value;
      Vec acc[R][kPanelVecs];
      if (widened) {
        tile<R, kPanelVecs>(x + (m - first) * K, K, pairs, Panel{panel}, next, acc);
      } else {
        tile<R, kPanelVecs>(x + (m - first) * K, K, pairs, WidenInto{Packed{wb, v0}, panel}, next, acc);
        widened = true;
      }
      next = {};
      consume(acc, m, v0);
    });
  }
}

}  // namespace

int64_t linear_item_count(int64_t M, int64_t N) {
  return (N / kBlockRows) * items_per_block(M) * ((M + kChunkRows - 1) / kChunkRows);
}

void linear_items(const LinearIn& x, int64_t M, int64_t K, const uint32_t* w, const float* bias,
                  const LinearOut& out, ItemClaims& claims) {
  const int64_t pairs = K / 2, per_block = items_per_block(M), per_chunk = out.N / kBlockRows * per_block;
  const int span = per_block == 1 ? kPanels : 1;  // panels per item
  const int item_lines = span * kPanelVecs * kLanes * 4 / 64;  // cache lines of an item's K pair
  // item j of a chunk: its block's first packed pair, offset to its first panel
  const auto weights_of = [&](int64_t j) {
    const int64_t panel = std::min<int64_t>(j % per_block, kPanels - 1);  // the rest's item: the last panel's
    return w + (j / per_block) * pairs * kBlockRows + panel * span * kPanelVecs * kLanes;
  };
  const float* rows = nullptr;  // chunk `held`'s rows as the tiles read them
  int64_t held = -1, begin, end;
  claims.claim(&begin, &end);
  while (begin < end) {
    int64_t next_begin = end, next_end = end;  // the run after this one, claimed before its last item
    for (int64_t i = begin; i < end; ++i) {
      if (i + 1 == end) claims.claim(&next_begin, &next_end);
      const int64_t following = i + 1 < end ? i + 1 : next_begin < next_end ? next_begin : -1;
      const int64_t chunk = i / per_chunk, j = i % per_chunk, b = j / per_block, first = chunk * kChunkRows;
      const int64_t last = std::min(M, first + kChunkRows);
      if (chunk != held) rows = tile_rows(x, K, first, last), held = chunk;
      const int64_t part = j % per_block, rest = per_block > kPanels ? rest_rows(last - first) : 0;
      int64_t lo = 0, hi = last - first;  // rows of the chunk this item takes
      int q0 = static_cast<int>(part) * span, q1 = q0 + span;
      if (part == kPanels) {
        lo = hi - rest, q0 = 0, q1 = kPanels;  // the rest's item: its rows over the whole block
      } else {
        hi -= rest;
      }
      if (lo == hi) continue;
      NextWeights next;  // the next item's lines of each K pair's 256-byte run of its block
      if (following >= 0) {
        next = {reinterpret_cast<const char*>(weights_of(following % per_chunk)), kBlockRows * 4, item_lines};
      }
      block_tiles(rows + lo * K, K, pairs, w + b * pairs * kBlockRows, lo, hi, q0, q1, next,
                  [&](const auto& acc, int64_t m, int v0) {
                    store_tile(acc, bias, out, first + m, b * kBlockRows + v0 * kLanes);
                  });
    }
    begin = next_begin, end = next_end;
  }
}

// Each row's largest output over blocks [block0, block1) (rounded to bf16 first where the model's logits
// are bf16): replaces best[r] / best_id[r] where strictly larger, so the first of equal values stays. x is
// laid out by linear_group_rows, once for all the parts.
void linear_argmax_part(const float* x, int64_t M, int64_t K, const uint32_t* w, int64_t block0, int64_t block1,
                        bool round_bf16, float* best, int64_t* best_id) {
  const int64_t pairs = K / 2;
  for (int64_t b = block0; b < block1; ++b) {
    NextWeights next;  // the next block, whole
    if (b + 1 < block1) next = {reinterpret_cast<const char*>(w + (b + 1) * pairs * kBlockRows), kBlockRows * 4, 4};
    block_tiles(x, K, pairs, w + b * pairs * kBlockRows, 0, M, 0, kPanels, next,
                [&](const auto& acc, int64_t m, int v0) {
      constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>, 0>;
      constexpr int C = std::extent_v<std::remove_reference_t<decltype(acc)>, 1>;
      for (int r = 0; r < R; ++r) {
        alignas(64) float values[C * kLanes];
        for (int c = 0; c < C; ++c) vspill(values + c * kLanes, round_bf16 ? vround_bf16(acc[r][c]) : acc[r][c]);
        for (int i = 0; i < C * kLanes; ++i)
          if (values[i] > best[m + r]) {
            best[m + r] = values[i];
            best_id[m + r] = b * kBlockRows + v0 * kLanes + i;
          }
      }
    });
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
