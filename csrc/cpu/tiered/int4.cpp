// The int4 (W4A16) matmul's fp32 form, built once per tier (avx2, avx512: csrc/cpu/vec.h), for CPUs
// without bf16 dot products: y = x W^T with w[n, k] = (q - 8) s + z per group of inputs, over the packed
// codes quant_int4.h describes ([N / 16][K / 8][16] uint32, codes 2p and 2p + 1 of a column at bits 4p
// and 16 + 4p of its lane).
//
// The same trick as the bf16 form: shifted into place and or-ed with 0x3F80, a pair of codes is two
// bf16 values 1 + q / 16, exact; widened to fp32 (a shift, a mask) they meet fp32 activations in FMAs.
// Per group, sum_k x_k w_k = 16 s sum_k x_k (1 + q_k / 16) + (z - 24 s) sum_k x_k, so scale and zero
// cost two FMAs per group and output column. A tile is R rows (1-4) times C vectors of columns; with few
// rows each chunk's even and odd codes feed separate sums (twice the independent FMA chains). From 12 rows
// on, the codes are dequantized once per block into an fp32 panel that 6-row tiles of plain FMAs share.
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kBlockCols = 16;  // columns per packed block
constexpr int64_t kChunkK = 8;      // codes per uint32 lane
constexpr int kBlockVecs = static_cast<int>(kBlockCols) / kLanes;
constexpr int kMaxRows = 4;

FOLO_VINLINE VecI vset1_i(uint32_t v) {
#if defined(__AVX512F__)
  return _mm512_set1_epi32(static_cast<int>(v));
#else
  return _mm256_set1_epi32(static_cast<int>(v));
#endif
}

// Pair P of a chunk's lanes: the even and odd codes of each lane as fp32 1 + q / 16.
template <int P>
FOLO_VINLINE void unpack_pair(VecI lanes, Vec& even, Vec& odd) {
#if defined(__AVX512F__)
  const VecI shifted = P == 0 ? _mm512_slli_epi32(lanes, 3) : _mm512_srli_epi32(lanes, 4 * P - 3);
  const VecI pair = _mm512_or_si512(_mm512_and_si512(shifted, vset1_i(0x00780078u)), vset1_i(0x3F803F80u));
#else
  const VecI shifted = P == 0 ? _mm256_slli_epi32(lanes, 3) : _mm256_srli_epi32(lanes, 4 * P - 3);
  const VecI pair = _mm256_or_si256(_mm256_and_si256(shifted, vset1_i(0x00780078u)), vset1_i(0x3F803F80u));
#endif
  even = bf16_even(pair);
  odd = bf16_odd(pair);
}

FOLO_VINLINE Vec load_scale(const float* p) { return vload(p); }
FOLO_VINLINE Vec load_scale(const uint16_t* p) { return vload_bf16(p); }

// Rows x[0..R) (fp32, stride K) times C column vectors starting at `codes` (vector c: block c / kBlockVecs,
// lane group c % kBlockVecs; blocks `block_stride` uint32 apart), written to y's rows (stride out.N) from
// column `col0`.
template <int R, int C, typename S>
FOLO_VINLINE void tile(const float* x, int64_t K, const float* xsum, int64_t groups, const uint32_t* codes,
                       int64_t block_stride, const S* scales, const S* zeros, int64_t sz_stride, int64_t group_size,
                       const LinearOut& out, int64_t row0, int64_t col0) {
  constexpr int A = R <= 2 ? 2 : 1;  // sum sets: even codes to set 0, odd to set A - 1
  Vec total[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) total[r][c] = vzero();
  const int64_t chunks_per_group = group_size / kChunkK, chunks = K / kChunkK;
  for (int64_t g = 0; g < groups; ++g) {
    Vec acc[A][R][C];
    for (int a = 0; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[a][r][c] = vzero();
    const int64_t ch1 = std::min(chunks, (g + 1) * chunks_per_group);
    for (int64_t ch = g * chunks_per_group; ch < ch1; ++ch) {
      VecI lanes[C];
      for (int c = 0; c < C; ++c) {
        const uint32_t* at = codes + (c / kBlockVecs) * block_stride + ch * kBlockCols + (c % kBlockVecs) * kLanes;
        _mm_prefetch(reinterpret_cast<const char*>(at) + 2048, _MM_HINT_T0);
        lanes[c] = vload_i(at);
      }
      const float* xk = x + ch * kChunkK;
      auto pair = [&](auto p) {
        constexpr int P = decltype(p)::value;
        Vec even[C], odd[C];
        for (int c = 0; c < C; ++c) unpack_pair<P>(lanes[c], even[c], odd[c]);
        for (int r = 0; r < R; ++r) {
          const Vec x0 = vbroadcast(xk + r * K + 2 * P), x1 = vbroadcast(xk + r * K + 2 * P + 1);
          for (int c = 0; c < C; ++c) {
            acc[0][r][c] = vfma(x0, even[c], acc[0][r][c]);
            acc[A - 1][r][c] = vfma(x1, odd[c], acc[A - 1][r][c]);
          }
        }
      };
      pair(std::integral_constant<int, 0>{});
      pair(std::integral_constant<int, 1>{});
      pair(std::integral_constant<int, 2>{});
      pair(std::integral_constant<int, 3>{});
    }
    for (int c = 0; c < C; ++c) {
      const int64_t sz = (c / kBlockVecs) * sz_stride + g * kBlockCols + (c % kBlockVecs) * kLanes;
      const Vec s = load_scale(scales + sz), z = load_scale(zeros + sz);
      const Vec big_scale = vmul(s, vset1(16.f)), offset = vfnma(s, vset1(24.f), z);  // 16 s, z - 24 s
      for (int r = 0; r < R; ++r) {
        const Vec sum = A == 2 ? vadd(acc[0][r][c], acc[A - 1][r][c]) : acc[0][r][c];
        total[r][c] = vfma(big_scale, sum, total[r][c]);
        total[r][c] = vfma(offset, vset1(xsum[r * groups + g]), total[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int64_t at = (row0 + r) * out.N + col0 + c * kLanes;
      if (out.f32 != nullptr) {
        vstore(out.f32 + at, total[r][c]);
      } else {
        vstore_bf16(out.bf16 + at, total[r][c]);
      }
    }
}

template <int C, typename S>
FOLO_VINLINE void row_tiles(const float* x, int64_t M, int64_t K, const float* xsum, int64_t groups,
                            const uint32_t* codes, int64_t block_stride, const S* scales, const S* zeros,
                            int64_t sz_stride, int64_t group_size, const LinearOut& out, int64_t col0) {
  for (int64_t m = 0; m < M; m += kMaxRows) {
    const float* xr = x + m * K;
    const float* sr = xsum + m * groups;
    switch (std::min<int64_t>(kMaxRows, M - m)) {
      case 4: tile<4, C>(xr, K, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      case 3: tile<3, C>(xr, K, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      case 2: tile<2, C>(xr, K, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      default: tile<1, C>(xr, K, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
    }
  }
}

// Many rows: up to kPanelBlocks blocks dequantized once into an fp32 panel ([k][kPanelVecs vectors]:
// w = 16 s (1 + q / 16) + (z - 24 s), one FMA a value), then 6-row tiles of plain FMAs over it.
constexpr int64_t kPanelRows = 12;
constexpr int kPanelBlocks = kBlockVecs == 1 ? 2 : 1;  // AVX-512: two 16-column blocks per panel
constexpr int kPanelVecs = kPanelBlocks * kBlockVecs;
constexpr int kPanelTileRows = 6;

template <typename S>
void dequantize_panel(const uint32_t* codes, int64_t block_stride, const S* scales, const S* zeros, int64_t sz_stride,
                      int64_t K, int64_t groups, int64_t group_size, int nblocks, float* panel) {
  const int64_t chunks_per_group = group_size / kChunkK, chunks = K / kChunkK;
  for (int blk = 0; blk < nblocks; ++blk)
    for (int64_t g = 0; g < groups; ++g)
      for (int c = 0; c < kBlockVecs; ++c) {
        const int64_t sz = blk * sz_stride + g * kBlockCols + c * kLanes;
        const Vec s = load_scale(scales + sz), z = load_scale(zeros + sz);
        const Vec big_scale = vmul(s, vset1(16.f)), offset = vfnma(s, vset1(24.f), z);
        float* col = panel + (blk * kBlockVecs + c) * kLanes;
        const int64_t ch1 = std::min(chunks, (g + 1) * chunks_per_group);
        for (int64_t ch = g * chunks_per_group; ch < ch1; ++ch) {
          const VecI lanes = vload_i(codes + blk * block_stride + ch * kBlockCols + c * kLanes);
          float* row = col + ch * kChunkK * kPanelVecs * kLanes;
          auto pair = [&](auto p) {
            constexpr int P = decltype(p)::value;
            Vec even, odd;
            unpack_pair<P>(lanes, even, odd);
            vstore(row + (2 * P) * kPanelVecs * kLanes, vfma(even, big_scale, offset));
            vstore(row + (2 * P + 1) * kPanelVecs * kLanes, vfma(odd, big_scale, offset));
          };
          pair(std::integral_constant<int, 0>{});
          pair(std::integral_constant<int, 1>{});
          pair(std::integral_constant<int, 2>{});
          pair(std::integral_constant<int, 3>{});
        }
      }
}

// Rows x[0..R) (stride K) times C vectors of the panel: y rows from row0, columns from col0.
template <int R, int C>
FOLO_VINLINE void panel_tile(const float* x, int64_t K, const float* panel, const LinearOut& out, int64_t row0,
                             int64_t col0) {
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    Vec w[C];
    for (int c = 0; c < C; ++c) w[c] = vload(panel + (k * kPanelVecs + c) * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec xr = vbroadcast(x + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = vfma(xr, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int64_t at = (row0 + r) * out.N + col0 + c * kLanes;
      if (out.f32 != nullptr) {
        vstore(out.f32 + at, acc[r][c]);
      } else {
        vstore_bf16(out.bf16 + at, acc[r][c]);
      }
    }
}

template <int C>
void panel_rows(const float* x, int64_t M, int64_t K, const float* panel, const LinearOut& out, int64_t col0) {
  for (int64_t m = 0; m < M; m += kPanelTileRows) {
    const float* xr = x + m * K;
    switch (std::min<int64_t>(kPanelTileRows, M - m)) {
      case 6: panel_tile<6, C>(xr, K, panel, out, m, col0); break;
      case 5: panel_tile<5, C>(xr, K, panel, out, m, col0); break;
      case 4: panel_tile<4, C>(xr, K, panel, out, m, col0); break;
      case 3: panel_tile<3, C>(xr, K, panel, out, m, col0); break;
      case 2: panel_tile<2, C>(xr, K, panel, out, m, col0); break;
      default: panel_tile<1, C>(xr, K, panel, out, m, col0); break;
    }
  }
}

template <typename S>
void blocks(const float* x, int64_t M, int64_t K, const float* xsum, int64_t groups, const uint32_t* codes,
            const S* scales, const S* zeros, int64_t group_size, const LinearOut& out, int64_t b0, int64_t b1) {
  const int64_t block_stride = (K / kChunkK) * kBlockCols, sz_stride = groups * kBlockCols;
  if (M >= kPanelRows) {
    thread_local std::vector<float> panel;
    panel.resize(static_cast<size_t>(K) * kPanelVecs * kLanes);
    for (int64_t b = b0; b < b1; b += kPanelBlocks) {
      const int nblocks = static_cast<int>(std::min<int64_t>(kPanelBlocks, b1 - b));
      dequantize_panel(codes + b * block_stride, block_stride, scales + b * sz_stride, zeros + b * sz_stride,
                       sz_stride, K, groups, group_size, nblocks, panel.data());
      if (nblocks * kBlockVecs == kPanelVecs) {
        panel_rows<kPanelVecs>(x, M, K, panel.data(), out, b * kBlockCols);
      } else {
        panel_rows<kBlockVecs>(x, M, K, panel.data(), out, b * kBlockCols);
      }
    }
    return;
  }
  // two blocks at a time where the registers hold them (AVX-512: 2 vectors; AVX2: 4, with one row)
  for (int64_t b = b0; b < b1;) {
    const uint32_t* cb = codes + b * block_stride;
    const S* sb = scales + b * sz_stride;
    const S* zb = zeros + b * sz_stride;
    if (b + 1 < b1 && kBlockVecs == 1) {
      row_tiles<2 * kBlockVecs>(x, M, K, xsum, groups, cb, block_stride, sb, zb, sz_stride, group_size, out,
                                b * kBlockCols);
      b += 2;
    } else {
      row_tiles<kBlockVecs>(x, M, K, xsum, groups, cb, block_stride, sb, zb, sz_stride, group_size, out,
                            b * kBlockCols);
      b += 1;
    }
  }
}

}  // namespace

void int4_blocks(const float* x, int64_t M, int64_t K, const float* xsum, int64_t groups, const uint32_t* codes,
                 const void* scales, const void* zeros, bool bf16_scales, int64_t group_size, const LinearOut& out,
                 int64_t b0, int64_t b1) {
  if (bf16_scales) {
    blocks(x, M, K, xsum, groups, codes, static_cast<const uint16_t*>(scales), static_cast<const uint16_t*>(zeros),
           group_size, out, b0, b1);
  } else {
    blocks(x, M, K, xsum, groups, codes, static_cast<const float*>(scales), static_cast<const float*>(zeros),
           group_size, out, b0, b1);
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
