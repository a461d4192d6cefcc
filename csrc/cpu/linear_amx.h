// The bf16 linear kernel's AMX form (linear.cpp registers the op and picks it): bf16 x of kAmxMinRows rows
// or more times the packed weight on an AMX host, with the tile unit's bf16 dot products (TDPBF16PS).
//
// The packed layout ([N/64][K/2][64 rows][2], see linear.cpp) is already the tile unit's: 16 K pairs of 16
// output rows, each pair's two values side by side, are a B tile read with a stride of 256 bytes. x rows
// are A tiles (16 rows x 32 K values) read in place. A work item is a 32-row unit of x times one 64-row
// weight block, as two halves of 32 outputs, each four fp32 C tiles (2 row tiles x 2 column tiles) fed by
// two A and two B tiles per 32 K values, so every tile load serves two dot products. A unit of 16 rows or
// fewer (a call of 16 rows, a last unit): one A tile times the block's 64 outputs as four C tiles
// (amx_unit16), the block's 4 KiB per 32 K values read in order, as a decode step streams it. A last unit of
// other than 16 or 32 rows is copied by the call to a zero-padded unit once (`tail`, amx_needs_tail).
//
// Each output's fp32 sum runs along K in the same order as the row-at-a-time form's, but the tile unit's
// arithmetic rounds apart from vdpbf16ps's (the two agree to within an fp32 step or so before the bf16
// rounding): so a row's bits depend on whether its call took this form, never on the other rows of the call.
#pragma once

#include "amx.h"
#include "isa.h"

#include <algorithm>
#include <cstdint>

namespace folovllm::cpu {
namespace {

constexpr int64_t kAmxMinRows = 16;  // a call of fewer rows streams its weight in the row-at-a-time form
constexpr int64_t kAmxUnitRows = 32;  // rows per work item: two A tiles
constexpr int64_t kAmxPairs = 16;     // K pairs per tile step: 32 K values of bf16, one 64-byte tile row
constexpr int64_t kAmxAhead = 2;      // tile steps the weights are prefetched ahead

// Whether a call of M rows of bf16 x, K columns, takes this form at the current tier.
inline bool amx_takes(int64_t M, int64_t K) { return M >= kAmxMinRows && K % (2 * kAmxPairs) == 0 && amx_runs(); }

// Whether a call of M rows reads its last unit from a zero-padded copy: a last unit of 16 rows is one A tile
// of x itself (amx_unit16), a whole unit two; any other count would read past x.
inline bool amx_needs_tail(int64_t M) { return M % kAmxUnitRows != 0 && M % kAmxUnitRows != 16; }

// The B tiles kAmxAhead steps of 32 K values past `wp` (`lines` 64-byte lines of each K pair's 256 bytes)
// pulled into L1: a tile load waits on memory otherwise, the hardware prefetchers not running ahead of it.
FOLO_INLINE void prefetch_b(const char* wp, int lines) {
  const char* ahead = wp + kAmxAhead * kAmxPairs * 256;
  for (int64_t q = 0; q < kAmxPairs; ++q)
    for (int l = 0; l < lines; ++l) _mm_prefetch(ahead + q * 256 + l * 64, _MM_HINT_T0);
}

// 32 rows of x (row stride `ld` elements) times 32 outputs of a packed block (`wh`: the block's first K
// pair, offset to the half's first output) into c [32][64] fp32 at the half's columns.
FOLO_TARGET_AMX inline void amx_unit_half(const uint16_t* x, int64_t ld, const char* wh, int64_t pairs, float* c) {
  zero_c_tiles();
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    prefetch_b(wh + p * 256, 2);
    _tile_loadd(4, x + 2 * p, ld * 2);
    _tile_loadd(5, x + 16 * ld + 2 * p, ld * 2);
    _tile_loadd(6, wh + p * 256, 256);
    _tile_loadd(7, wh + p * 256 + 64, 256);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64 * 4);
  _tile_stored(1, c + 16, 64 * 4);
  _tile_stored(2, c + 16 * 64, 64 * 4);
  _tile_stored(3, c + 16 * 64 + 16, 64 * 4);
}

// At most 16 rows of x (a unit's first A tile) times a whole packed block `wb` into c [16][64]: the block's 64
// outputs as four C tiles, so each 32 K values read the block's 4 KiB in order, and half the tile work of a
// 32-row unit.
FOLO_TARGET_AMX inline void amx_unit16(const uint16_t* x, int64_t ld, const char* wb, int64_t pairs, float* c) {
  zero_c_tiles();
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    const char* wp = wb + p * 256;
    prefetch_b(wp, 4);
    _tile_loadd(4, x + 2 * p, ld * 2);
    _tile_loadd(5, wp, 256);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, wp + 64, 256);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, wp + 128, 256);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, wp + 192, 256);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, 64 * 4);
  _tile_stored(1, c + 16, 64 * 4);
  _tile_stored(2, c + 32, 64 * 4);
  _tile_stored(3, c + 48, 64 * 4);
}

// Rows of x a chunk holds (whole units): beyond this many, items run chunk by chunk, each chunk's x staying
// in L2 (about 512 KiB of it) while every weight block passes; the weights are read once per chunk.
inline int64_t amx_chunk_units(int64_t K) {
  return std::max<int64_t>(kChunkRows / kAmxUnitRows, (512 << 10) / (K * 2 * kAmxUnitRows));
}

// Work items of a call of M rows: item i is a 32-row unit of x times one weight block. Up to a chunk's
// rows, items run block by block (a block's units one after another, the block in cache); beyond, chunk by
// chunk (amx_chunk_units), each chunk's items block by block.
inline int64_t amx_item_count(int64_t M, int64_t N) {
  return (N / kBlockRows) * ((M + kAmxUnitRows - 1) / kAmxUnitRows);
}

// Rows [m, m + rows) of c [.., 64] fp32 (+ bias) rounded to bf16 into y's columns of block b.
FOLO_TARGET_AMX inline void amx_store(const float* c, int64_t rows, const float* bias, c10::BFloat16* y, int64_t N,
                                      int64_t m, int64_t b) {
  const int64_t col = b * kBlockRows;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 4; ++j) {
      __m512 v = _mm512_load_ps(c + r * kBlockRows + j * 16);
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + col + j * 16));
      store_bf16(y + (m + r) * N + col + j * 16, v);
    }
}

FOLO_TARGET_AMX void amx_linear_items(const uint16_t* x, const uint16_t* tail, int64_t M, int64_t K, const char* w,
                                      const float* bias, c10::BFloat16* y, int64_t N, int64_t i0, int64_t i1) {
  const int64_t blocks = N / kBlockRows, pairs = K / 2, units = (M + kAmxUnitRows - 1) / kAmxUnitRows;
  const int64_t per_chunk = amx_chunk_units(K);
  alignas(64) float c[kAmxUnitRows * kBlockRows];
  amx_configure();
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t chunk = i / (blocks * per_chunk), in_chunk = i % (blocks * per_chunk);
    const int64_t chunk_units = std::min(per_chunk, units - chunk * per_chunk);
    const int64_t b = in_chunk / chunk_units, u = chunk * per_chunk + in_chunk % chunk_units;
    const int64_t m = u * kAmxUnitRows, rows = std::min(kAmxUnitRows, M - m);
    const uint16_t* xu = amx_needs_tail(rows) ? tail : x + m * K;
    const char* wb = w + b * pairs * kBlockRows * 4;
    if (rows <= 16) {
      amx_unit16(xu, K, wb, pairs, c);
    } else {
      amx_unit_half(xu, K, wb, pairs, c);
      amx_unit_half(xu, K, wb + 128, pairs, c + 32);
    }
    amx_store(c, rows, bias, y, N, m, b);
  }
  _tile_release();
}

}  // namespace
}  // namespace folovllm::cpu
