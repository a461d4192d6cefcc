// The prefill kernel's AMX form (attention_prefill.h picks it on an AMX host): the bf16 dot-product form's work
// items with Q K^T and P V on the tile unit (TDPBF16PS, amx.h) instead of vdpbf16ps. That form's packed keys
// ([D/2 pairs of dims][kTile keys][2]) and values ([kTile/2 pairs of keys][D][2]) are B tiles as they lie; 16
// query rows are an A tile of q (32 dims) for the scores and of the rounded probabilities (32 keys) for the
// values. Per 16 rows: the scores as four C tiles of 16 keys, stepping through D 32 dims at a time; the values
// as four C tiles of 16 dims loaded from the rows' fp32 accumulators (the softmax's rescaling already applied),
// stepping through the tile's keys 32 at a time, and stored back. The online softmax between them is the other
// form's. Every sum runs in the same order, but the tile unit rounds apart from vdpbf16ps: the two forms agree
// to within a bf16 step, not bit for bit.
#pragma once

#include "amx.h"
#include "isa.h"

#include <cstdint>

namespace folovllm::cpu {
namespace {

// C tiles 0-3 += A tile 4 . the B tiles at b, b + 32, b + 64, b + 96 (16 columns x 2 bf16 apart; rows `stride`
// bytes apart).
FOLO_TARGET_AMX FOLO_INLINE void dp_four(const uint16_t* b, int64_t stride) {
  _tile_loadd(6, b, stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b + 32, stride);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(6, b + 64, stride);
  _tile_dpbf16ps(2, 4, 6);
  _tile_loadd(7, b + 96, stride);
  _tile_dpbf16ps(3, 4, 7);
}

// C tiles 0-3 to (store) or from 16 rows of 64 fp32 at c, rows `stride` bytes apart.
FOLO_TARGET_AMX FOLO_INLINE void store_four(float* c, int64_t stride) {
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 32, stride);
  _tile_stored(3, c + 48, stride);
}
FOLO_TARGET_AMX FOLO_INLINE void load_four(const float* c, int64_t stride) {
  _tile_loadd(0, c, stride);
  _tile_loadd(1, c + 16, stride);
  _tile_loadd(2, c + 32, stride);
  _tile_loadd(3, c + 48, stride);
}

// scores[16][Tile] = scale * q[16][D] (bf16, row stride D) . the keys of one packed tile.
template <int64_t Tile>
FOLO_TARGET_AMX inline void amx_score_rows16(const uint16_t* q, int64_t D, const uint16_t* keys, float scale,
                                             float* scores) {
  static_assert(Tile == 64, "a tile's keys are four C tiles of 16");
  zero_c_tiles();
  for (int64_t d = 0; d < D; d += 32) {  // dims [d, d + 32): pairs d/2 on, Tile keys x 2 each
    _tile_loadd(4, q + d, D * 2);
    dp_four(keys + d * Tile, Tile * 4);
  }
  store_four(scores, Tile * 4);
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < 16 * Tile; i += 16)
    _mm512_storeu_ps(scores + i, _mm512_mul_ps(_mm512_loadu_ps(scores + i), s));
}

// acc[16][D] (fp32, row stride D) += probs[16][Tile] (bf16, row stride Tile) . the values of one packed tile.
template <int64_t Tile>
FOLO_TARGET_AMX inline void amx_add_values16(const uint16_t* probs, const uint16_t* values, int64_t D, float* acc) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {  // four C tiles of 16 dims
    load_four(acc + d0, D * 4);
    for (int64_t k = 0; k < Tile; k += 32) {  // pairs of keys k/2 on, dims d0 on, x 2 each
      _tile_loadd(4, probs + k, Tile * 2);
      dp_four(values + k * D + 2 * d0, D * 4);
    }
    store_four(acc + d0, D * 4);
  }
}

}  // namespace
}  // namespace folovllm::cpu
