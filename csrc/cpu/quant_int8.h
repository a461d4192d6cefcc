// W8A16 with one scale per output column: y[m, n] = scale[n] * sum_k x[m, k] q[n, k], q int8 (the int8
// LM head and int8 linears). A code in [-128, 127] is exact in bf16, so the scale waits until the end.
//
// Packed layout (folovllm/model/quantization/cpu_int4.py: pack_int8 builds it once at load): columns in blocks of 16, K in pairs; one pair
// of one block is 32 int8, column j's codes k and k + 1 at bytes 2j and 2j + 1: widened to fp32 and
// narrowed to bf16 in order, that is the pair layout AVX512_BF16's dot product takes.
//
// Loops: threads split the column blocks, two at a time. Up to 4 rows read the codes directly (each byte
// streamed once); more rows first widen four blocks' codes to a bf16 tile (K x 64, in L1/L2), which
// every block of 6 rows then reads: the widening is paid once per column, not once per row block (4
// blocks, 24 accumulators, ran the LM head at 64 rows ~5 % faster than 2 blocks).
#pragma once

#include "quant_common.h"

#include <limits>

namespace folovllm::cpu {
namespace {

constexpr int kInt8Cols = 2;       // column vectors held in registers at once (reading codes directly)
constexpr int kInt8TileCols = 4;   // column vectors per bf16 tile: 6 rows x 4 = 24 accumulators
constexpr int kInt8DirectRows = 4;  // rows up to which the codes are read directly
constexpr int kInt8TileRows = 6;    // rows per register block over a bf16 tile

// Where a tile's outputs go: y [M, N] (Out = float* or c10::BFloat16*), or ArgmaxRows, which keeps only
// each row's best logit. offset(y, m, N, col): the same for rows from m and columns from col on;
// put(y, r, N, col, v): 16 outputs of row r from column col.
template <typename T>
FOLO_INLINE T* offset(T* y, int64_t m, int64_t N, int64_t col) { return y + m * N + col; }
template <typename T>
FOLO_TARGET_AVX512_BF16 FOLO_INLINE void put(T* y, int r, int64_t N, int64_t col, __m512 v) { store16(y + r * N + col, v); }

// Each row's largest logit so far and its column (the first of equal ones, the first NaN if any, as
// torch.argmax has it), the logits rounded to bf16 as a bf16 int8_gemm would return them: the same
// tokens as int8_gemm(x).float().argmax(-1), without the [rows, N] logits.
struct ArgmaxRows {
  float* best;   // [rows], from -inf
  int64_t* id;   // [rows], from 0
  int64_t col0;  // column of this view's first output
};
// Each work item's ArgmaxRows in the slots of its first task ([tasks, M]; ids -1 where no item starts),
// reduced in column order to each row's first maximum (the first NaN, if any), as torch.argmax has it.
struct ItemArgmax {
  int64_t M;
  std::vector<float> best;
  std::vector<int64_t> id;
  ItemArgmax(int64_t tasks, int64_t rows)
      : M(rows), best(tasks * rows, -std::numeric_limits<float>::infinity()), id(tasks * rows, -1) {}
  ArgmaxRows rows(int64_t p0) {  // the item starting at task p0
    std::fill(id.begin() + p0 * M, id.begin() + (p0 + 1) * M, 0);
    return {best.data() + p0 * M, id.data() + p0 * M, 0};
  }
  void reduce(int64_t* out) const {
    const int64_t tasks = static_cast<int64_t>(id.size()) / std::max<int64_t>(M, 1);
    for (int64_t m = 0; m < M; ++m) {
      float top = -std::numeric_limits<float>::infinity();
      int64_t at = 0;
      for (int64_t t = 0; t < tasks; ++t) {
        const float v = best[t * M + m];
        if (id[t * M + m] < 0 || top != top) continue;
        if (v > top || v != v) top = v, at = id[t * M + m];
      }
      out[m] = at;
    }
  }
};
FOLO_INLINE ArgmaxRows offset(ArgmaxRows y, int64_t m, int64_t, int64_t col) {
  return {y.best + m, y.id + m, y.col0 + col};
}
FOLO_TARGET_AVX512_BF16 FOLO_INLINE void put(ArgmaxRows y, int r, int64_t, int64_t col, __m512 v) {
  float& best = y.best[r];
  if (best != best) return;  // a NaN already won
  const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(v);
  v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  if (nan != 0) {
    best = v[__builtin_ctz(nan)];
    y.id[r] = y.col0 + col + __builtin_ctz(nan);
    return;
  }
  const float top = _mm512_reduce_max_ps(v);
  if (!(top > best)) return;  // an equal value further on is not the first maximum
  best = top;
  y.id[r] = y.col0 + col + __builtin_ctz(_mm512_cmpeq_ps_mask(v, _mm512_set1_ps(top)));
}

// One pair of 16 columns' int8 codes (32 bytes) -> 16 bf16 pairs.
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512bh widen_int8(const int8_t* p) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512 hi =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);  // low half from lo: columns 0..7, then 8..15
}

// R rows x C column blocks over all of K. Weights: int8 codes (Tiled false: a block every `stride` bytes,
// 32 per pair) or a bf16 tile (Tiled true: pair kp's C vectors at tile[(kp * C + c) * 32]). Two accumulator
// sets (even and odd pairs) keep the dot-product chains independent when R is small.
template <int R, int C, bool Tiled, typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void int8_tile(const c10::BFloat16* x, int64_t K, const int8_t* codes, int64_t stride,
                         const c10::BFloat16* tile, const S* scales, Out y, int64_t N, const int8_t* codes_end) {
  constexpr int kSets = R * C >= 12 ? 1 : 2;  // enough independent chains already with one set
  __m512 acc[kSets][R][C];
  for (int a = 0; a < kSets; ++a)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[a][r][c] = _mm512_setzero_ps();
  const int32_t* xw = reinterpret_cast<const int32_t*>(x);  // bf16 pairs
  const int64_t pairs = K / 2;
  // set A's accumulators take pair kp (a compile-time set index keeps them in registers)
  auto step = [&](auto set, int64_t kp) FOLO_LAMBDA_AVX512_BF16 {
    constexpr int A = decltype(set)::value % kSets;
    __m512bh w[C];
    for (int c = 0; c < C; ++c)
      w[c] = Tiled ? (__m512bh)_mm512_loadu_si512(tile + (kp * C + c) * 32) : widen_int8(codes + c * stride + kp * 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(xw[r * pairs + kp]);
      for (int c = 0; c < C; ++c) acc[A][r][c] = _mm512_dpbf16_ps(acc[A][r][c], w[c], xv);
    }
  };
  int64_t kp = 0;
  for (; kp + 2 <= pairs; kp += 2) {
    if constexpr (!Tiled)
      for (int c = 0; c < C; ++c) prefetch_ahead(codes + c * stride + kp * 32, codes_end);
    step(std::integral_constant<int, 0>{}, kp);
    step(std::integral_constant<int, 1>{}, kp + 1);
  }
  if (kp < pairs) step(std::integral_constant<int, 0>{}, kp);
  for (int c = 0; c < C; ++c) {
    const __m512 s = load16(scales + c * kBlockCols);
    for (int r = 0; r < R; ++r)
      put(y, r, N, c * kBlockCols,
          _mm512_mul_ps(s, kSets == 2 ? _mm512_add_ps(acc[0][r][c], acc[kSets - 1][r][c]) : acc[0][r][c]));
  }
}

template <int C, bool Tiled, typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void int8_rows(int rows, const c10::BFloat16* x, int64_t K, const int8_t* codes, int64_t stride,
                         const c10::BFloat16* tile, const S* scales, Out y, int64_t N, const int8_t* codes_end) {
  switch (rows) {
    case 6: int8_tile<6, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
    case 5: int8_tile<5, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
    case 4: int8_tile<4, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
    case 3: int8_tile<3, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
    case 2: int8_tile<2, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
    default: int8_tile<1, C, Tiled>(x, K, codes, stride, tile, scales, y, N, codes_end); break;
  }
}

// Column blocks [b0, b1) of y [M, N] from bf16 x [M, K].
template <typename S, typename Out>
FOLO_TARGET_AVX512_BF16 void int8_blocks(const c10::BFloat16* x, int64_t M, int64_t K, const int8_t* codes, const S* scales,
                           Out y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t stride = K * kBlockCols;  // bytes per column block
  const bool tiled = M > kInt8DirectRows;
  const int64_t col_step = tiled ? kInt8TileCols : kInt8Cols;
  std::vector<c10::BFloat16> tile(tiled ? K * kInt8TileCols * kBlockCols : 0);
  const int8_t* codes_end = codes + b1 * stride;  // this thread's last weight byte, + 1
  for (int64_t b = b0; b < b1; b += col_step) {
    const int cols = static_cast<int>(std::min<int64_t>(col_step, b1 - b));
    const int8_t* cb = codes + b * stride;
    if (tiled) {
      for (int64_t kp = 0; kp < K / 2; ++kp)
        for (int c = 0; c < cols; ++c)
          _mm512_storeu_si512(tile.data() + (kp * cols + c) * 32, (__m512i)widen_int8(cb + c * stride + kp * 32));
    }
    const int row_block = tiled ? kInt8TileRows : kInt8DirectRows;
    for (int64_t m = 0; m < M; m += row_block) {
      const int rows = static_cast<int>(std::min<int64_t>(row_block, M - m));
      const c10::BFloat16* xr = x + m * K;
      const Out yr = offset(y, m, N, b * kBlockCols);
      const S* sb = scales + b * kBlockCols;
      if (tiled && cols == 4) int8_rows<4, true>(rows, xr, K, cb, stride, tile.data(), sb, yr, N, codes_end);
      else if (tiled && cols == 3) int8_rows<3, true>(rows, xr, K, cb, stride, tile.data(), sb, yr, N, codes_end);
      else if (tiled && cols == 2) int8_rows<2, true>(rows, xr, K, cb, stride, tile.data(), sb, yr, N, codes_end);
      else if (tiled) int8_rows<1, true>(rows, xr, K, cb, stride, tile.data(), sb, yr, N, codes_end);
      else if (cols == 2) int8_rows<2, false>(rows, xr, K, cb, stride, nullptr, sb, yr, N, codes_end);
      else int8_rows<1, false>(rows, xr, K, cb, stride, nullptr, sb, yr, N, codes_end);
    }
  }
}

void check_int8_packed(const at::Tensor& codes, const at::Tensor& scales, int64_t K) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 4 && codes.size(2) == kBlockCols &&
                  codes.size(3) == 2 && codes.is_contiguous(),
              "codes must be int8 [N / 16, K / 2, 16, 2], contiguous (pack_int8's form)");
  TORCH_CHECK(codes.size(1) * 2 == K, "x's last dim (", K, ") does not match the packed weight's K (",
              codes.size(1) * 2, ")");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == codes.size(0) * kBlockCols && scales.is_contiguous() &&
                  (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kBFloat16),
              "scales must be float32 or bfloat16 [N], contiguous");
}

// bf16 rows [M, K] -> y [M, N] (bf16 or fp32).
void run_int8(const at::Tensor& xb, const at::Tensor& codes, const at::Tensor& scales, at::Tensor& y) {
  const int64_t M = xb.size(0), K = xb.size(1), N = y.size(1), blocks = N / kBlockCols;
  const auto* xp = xb.const_data_ptr<c10::BFloat16>();
  const int8_t* cp = codes.const_data_ptr<int8_t>();
  parallel_tasks((blocks + kInt8Cols - 1) / kInt8Cols, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kInt8Cols, b1 = std::min(blocks, p1 * kInt8Cols);
    auto blocks_to = [&](auto* out) {
      if (scales.scalar_type() == at::kBFloat16)
        int8_blocks(xp, M, K, cp, scales.const_data_ptr<c10::BFloat16>(), out, N, b0, b1);
      else
        int8_blocks(xp, M, K, cp, scales.const_data_ptr<float>(), out, N, b0, b1);
    };
    if (y.scalar_type() == at::kFloat)
      blocks_to(y.mutable_data_ptr<float>());
    else
      blocks_to(y.mutable_data_ptr<c10::BFloat16>());
  });
}

// bf16 rows [M, K] -> ids [M] (int64): each row's argmax of run_int8's bf16 y, without y. Each work item
// keeps its own rows' best (slot p0: the item's first task), then the items are reduced in column order.
void run_int8_argmax(const at::Tensor& xb, const at::Tensor& codes, const at::Tensor& scales, at::Tensor& ids) {
  const int64_t M = xb.size(0), K = xb.size(1), N = codes.size(0) * kBlockCols, blocks = N / kBlockCols;
  const int64_t tasks = (blocks + kInt8Cols - 1) / kInt8Cols;
  ItemArgmax items(tasks, M);
  const auto* xp = xb.const_data_ptr<c10::BFloat16>();
  const int8_t* cp = codes.const_data_ptr<int8_t>();
  parallel_tasks(tasks, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kInt8Cols, b1 = std::min(blocks, p1 * kInt8Cols);
    const ArgmaxRows rows = items.rows(p0);
    if (scales.scalar_type() == at::kBFloat16)
      int8_blocks(xp, M, K, cp, scales.const_data_ptr<c10::BFloat16>(), rows, N, b0, b1);
    else
      int8_blocks(xp, M, K, cp, scales.const_data_ptr<float>(), rows, N, b0, b1);
  });
  items.reduce(ids.mutable_data_ptr<int64_t>());
}

}  // namespace
}  // namespace folovllm::cpu
