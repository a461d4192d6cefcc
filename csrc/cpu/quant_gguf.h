// gguf_gemm at the AVX-512 BF16 tier: y = x W^T over GGUF-typed weights in their own packed layout
// (gguf_layout.h), every type's codes turned into bf16 values 1 + q / 2^b in registers (a shift or two and
// a ternary-logic op per 32 codes; Q8_0's bytes widened), multiplied with bf16 activations in AVX512_BF16
// dot products with fp32 sums, each group's scale S and offset O applied once per output (two FMAs).
//
// Few rows read the codes as they go (each weight byte streamed once, the next lines asked for ahead, as
// the int4 kernel does). From kGgufPanelRows rows on, a pair of column blocks is unpacked once into a bf16
// panel with its groups' S and O (K x 64 bytes: L2), which 6-row tiles of dot products then share.
#pragma once

#include "gguf_layout.h"
#include "quant_int4.h"
#include "quant_int8.h"

#include <c10/util/SmallVector.h>

namespace folovllm::cpu {
namespace {

constexpr int64_t kGgufPanelRows = 8;  // rows from which a column pair's codes are unpacked once
constexpr int kGgufRowBlock = 4;       // rows per register tile, reading the codes
constexpr int kGgufPanelTileRows = 6;  // rows per register tile over a panel
constexpr int kGgufCols = 2;           // column blocks per tile (a task's step)

// One part of a gguf_gemm weight: `blocks` column blocks of one type from `data`, whose outputs start at
// column col0 of y.
struct GgufPartView {
  int64_t type;
  const uint8_t* data;
  int64_t blocks, block_bytes, meta_area, col0;
  GgufLayout layout;
};

// A gguf_gemm weight: its parts (checked), their outputs N and inputs K, and the tasks threads split: pairs of
// column blocks within a part (a part's last block alone where it has an odd count), numbered across the
// parts in order (first_task[p]: part p's first).
struct GgufWeight {
  c10::SmallVector<GgufPartView, 4> parts;
  c10::SmallVector<int64_t, 5> first_task;
  int64_t N = 0, K = 0;

  int64_t tasks() const { return first_task.back(); }
};

constexpr int64_t kGgufPartFields = 4;  // a parts row: (ggml type, outputs, byte offset, inputs)

// weight uint8 [bytes] and parts int64 [P, 4] (gguf_native.py's GGUFWeight) as a GgufWeight, checked.
GgufWeight gguf_weight(const at::Tensor& weight, const at::Tensor& parts) {
  TORCH_CHECK(weight.device().is_cpu() && parts.device().is_cpu(), "gguf weights live on the CPU");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.dim() == 1 && weight.is_contiguous(),
              "weight must be a contiguous uint8 [bytes] (gguf_native.py's packed form)");
  TORCH_CHECK(parts.scalar_type() == at::kLong && parts.dim() == 2 && parts.size(1) == kGgufPartFields &&
                  parts.size(0) > 0 && parts.is_contiguous(),
              "parts must be a contiguous int64 [P, 4]: (ggml type, outputs, byte offset, inputs) per part");
  GgufWeight w;
  w.first_task.push_back(0);
  const int64_t* row = parts.const_data_ptr<int64_t>();
  for (int64_t p = 0; p < parts.size(0); ++p, row += kGgufPartFields) {
    GgufPartView v{};
    v.type = row[0];
    TORCH_CHECK(gguf_layout(v.type, v.layout), "part ", p, ": ggml type ", v.type, " is not held packed");
    const int64_t rows = row[1], offset = row[2], K = row[3];
    TORCH_CHECK(p == 0 || K == w.K, "part ", p, " has ", K, " inputs, part 0 has ", w.K);
    TORCH_CHECK(K > 0 && K % v.layout.super_k == 0, "part ", p, ": ", K, " inputs are not whole blocks of ",
                v.layout.super_k);
    TORCH_CHECK(rows > 0 && rows % kGgufBlockCols == 0, "part ", p, ": outputs (", rows, ") must be a positive "
                "multiple of 16");
    v.blocks = rows / kGgufBlockCols;
    v.block_bytes = gguf_block_bytes(v.layout, K);
    v.meta_area = gguf_meta_area(v.layout, K);
    TORCH_CHECK(offset >= 0 && offset + v.blocks * v.block_bytes <= weight.numel(), "part ", p,
                " runs past the weight's ", weight.numel(), " bytes");
    v.data = weight.const_data_ptr<uint8_t>() + offset;
    v.col0 = w.N;
    w.K = K;
    w.N += rows;
    w.parts.push_back(v);
    w.first_task.push_back(w.first_task.back() + (v.blocks + kGgufCols - 1) / kGgufCols);
  }
  return w;
}

// fn(part, b0, b1) for each part's column blocks [b0, b1) within tasks [t0, t1).
template <typename Fn>
void gguf_ranges(const GgufWeight& w, int64_t t0, int64_t t1, Fn&& fn) {
  for (size_t p = 0; p < w.parts.size(); ++p) {
    const int64_t a = std::max(t0, w.first_task[p]), b = std::min(t1, w.first_task[p + 1]);
    if (a < b)
      fn(w.parts[p], (a - w.first_task[p]) * kGgufCols,
         std::min(w.parts[p].blocks, (b - w.first_task[p]) * kGgufCols));
  }
}

FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512 half16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512 i8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// v shifted right by S bits (left by -S)
template <int S>
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512i shift_lanes(__m512i v) {
  if constexpr (S > 0) return _mm512_srli_epi32(v, S);
  else if constexpr (S < 0) return _mm512_slli_epi32(v, -S);
  else return v;
}
// (bits & mask) | rest
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512i take_bits(__m512i bits, int32_t mask, __m512i rest) {
  return _mm512_ternarylogic_epi32(bits, _mm512_set1_epi32(mask), rest, 0xEA);
}
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512i bf16_one() { return _mm512_set1_epi32(0x3F803F80); }

// The types' differences: inputs per group, whether w has an offset, how pair I (0 .. pairs) of a loaded
// group becomes 16 bf16 pairs, and the group's S and O from the meta area.
template <GgufType T>
struct GgufBf16 {
  static constexpr int64_t kGroupK = T == GgufType::kQ6_K ? 16 : 32;
  static constexpr int kPairs = static_cast<int>(kGroupK / 2);
  static constexpr int kChunks = kPairs / 4;
  static constexpr int64_t kGroupBytes = T == GgufType::kQ8_0 ? 512 : T == GgufType::kQ5_K ? 320
                                         : T == GgufType::kQ6_K ? 192 : 256;
  static constexpr bool kHigh = T == GgufType::kQ5_K || T == GgufType::kQ6_K;
  static constexpr bool kOffset = T != GgufType::kQ8_0;

  // A group's codes at p: the lines ahead asked for, its high bits' lanes loaded (the nibble types with them).
  static FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512i start(const uint8_t* p, const uint8_t* end) {
    for (int64_t line = 0; line < kGroupBytes; line += 64) prefetch_ahead(p + line, end);
    if constexpr (kHigh) return _mm512_loadu_si512(p + 64 * kChunks);
    return _mm512_setzero_si512();
  }

  // Chunk I / 4's low nibbles (loaded as pair I = 4c starts it).
  template <int I>
  static FOLO_TARGET_AVX512_BF16 FOLO_INLINE void next_chunk(const uint8_t* p, __m512i& lo) {
    if constexpr (T != GgufType::kQ8_0 && I % 4 == 0) lo = _mm512_loadu_si512(p + 64 * (I / 4));
  }

  // Pair I of a group at p as 16 bf16 pairs, from its chunk's low nibbles and the group's high bits.
  template <int I>
  static FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512bh pair(const uint8_t* p, __m512i lo, __m512i hi) {
    constexpr int c = I / 4, q = I % 4;
    if constexpr (T == GgufType::kQ8_0) {
      return widen_int8(reinterpret_cast<const int8_t*>(p) + 32 * I);
    } else if constexpr (T == GgufType::kQ5_K) {
      const __m512i low = take_bits(shift_lanes<4 * q - 2>(lo), 0x003C003C, bf16_one());
      return (__m512bh)take_bits(shift_lanes<4 * c + q - 6>(hi), 0x00400040, low);
    } else if constexpr (T == GgufType::kQ6_K) {
      const __m512i low = take_bits(shift_lanes<4 * q - 1>(lo), 0x001E001E, bf16_one());
      return (__m512bh)take_bits(shift_lanes<2 * (4 * c + q) - 5>(hi), 0x00600060, low);
    } else {
      return (__m512bh)take_bits(shift_lanes<4 * q - 3>(lo), 0x00780078, bf16_one());
    }
  }

  // S and O of group g from a column block's meta area.
  static FOLO_TARGET_AVX512_BF16 FOLO_INLINE void scale(const uint8_t* meta, int64_t g, __m512& S, __m512& O) {
    if constexpr (T == GgufType::kQ4_0) {
      const __m512 d = half16(meta + 32 * g);
      S = _mm512_mul_ps(d, _mm512_set1_ps(16.f));
      O = _mm512_mul_ps(d, _mm512_set1_ps(-24.f));
    } else if constexpr (T == GgufType::kQ4_1) {
      const __m512 d = half16(meta + 64 * g);
      S = _mm512_mul_ps(d, _mm512_set1_ps(16.f));
      O = _mm512_sub_ps(half16(meta + 64 * g + 32), S);
    } else if constexpr (T == GgufType::kQ8_0) {
      S = half16(meta + 32 * g);
      O = _mm512_setzero_ps();
    } else if constexpr (T == GgufType::kQ6_K) {
      const uint8_t* sb = meta + 288 * (g >> 4);
      const __m512 s = _mm512_mul_ps(half16(sb), i8x16(sb + 32 + 16 * (g & 15)));
      S = _mm512_mul_ps(s, _mm512_set1_ps(64.f));
      O = _mm512_mul_ps(s, _mm512_set1_ps(-96.f));
    } else {  // Q4_K, Q5_K
      const uint8_t* sb = meta + 320 * (g >> 3);
      const __m512 s = _mm512_mul_ps(half16(sb), u8x16(sb + 64 + 16 * (g & 7)));
      const __m512 dm = _mm512_mul_ps(half16(sb + 32), u8x16(sb + 192 + 16 * (g & 7)));
      S = _mm512_mul_ps(s, _mm512_set1_ps(T == GgufType::kQ5_K ? 32.f : 16.f));
      O = _mm512_sub_ps(_mm512_sub_ps(_mm512_setzero_ps(), dm), S);  // -(dmin m) - S
    }
  }

  // A row's sum of x over group g, from its sums per 16 inputs.
  static FOLO_INLINE float xsum(const float* row_sums16, int64_t g) {
    if constexpr (kGroupK == 16) return row_sums16[g];
    else return row_sums16[2 * g] + row_sums16[2 * g + 1];
  }
};

// R rows x C column blocks over all of K, reading the codes (A accumulator sets per output vector).
template <GgufType T, int R, int C, int A, typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_tile(const c10::BFloat16* x, int64_t K, const float* xsum16, const uint8_t* block,
                                       int64_t block_bytes, int64_t meta_area, Out y, int64_t N, const uint8_t* end) {
  using F = GgufBf16<T>;
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const int32_t* xw = reinterpret_cast<const int32_t*>(x);  // bf16 pairs
  const int64_t x_stride = K / 2, sums_stride = K / 16, groups = K / F::kGroupK;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[A][R][C];
    for (int a = 0; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[a][r][c] = _mm512_setzero_ps();
    const uint8_t* at[C];
    __m512i lo[C], hi[C];
    for (int c = 0; c < C; ++c) {
      lo[c] = _mm512_setzero_si512();
      at[c] = block + c * block_bytes + meta_area + g * F::kGroupBytes;
      hi[c] = F::start(at[c], end);
    }
    const int32_t* xg = xw + g * F::kPairs;
#define GGUF_PAIR(I)                                                                          \
  if constexpr (I < F::kPairs) {                                                              \
    __m512bh w[C];                                                                            \
    for (int c = 0; c < C; ++c) {                                                             \
      F::template next_chunk<I>(at[c], lo[c]);                                                \
      w[c] = F::template pair<I>(at[c], lo[c], hi[c]);                                        \
    }                                                                                         \
    for (int r = 0; r < R; ++r) {                                                             \
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(xg[r * x_stride + I]);                  \
      for (int c = 0; c < C; ++c) acc[I % A][r][c] = _mm512_dpbf16_ps(acc[I % A][r][c], w[c], xv); \
    }                                                                                         \
  }
    GGUF_PAIR(0) GGUF_PAIR(1) GGUF_PAIR(2) GGUF_PAIR(3) GGUF_PAIR(4) GGUF_PAIR(5) GGUF_PAIR(6) GGUF_PAIR(7)
    GGUF_PAIR(8) GGUF_PAIR(9) GGUF_PAIR(10) GGUF_PAIR(11) GGUF_PAIR(12) GGUF_PAIR(13) GGUF_PAIR(14) GGUF_PAIR(15)
#undef GGUF_PAIR
    for (int a = 1; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[0][r][c] = _mm512_add_ps(acc[0][r][c], acc[a][r][c]);
    for (int c = 0; c < C; ++c) {
      __m512 S, O;
      F::scale(block + c * block_bytes, g, S, O);
      for (int r = 0; r < R; ++r) {
        out[r][c] = _mm512_fmadd_ps(S, acc[0][r][c], out[r][c]);
        if constexpr (F::kOffset)
          out[r][c] = _mm512_fmadd_ps(O, _mm512_set1_ps(F::xsum(xsum16 + r * sums_stride, g)), out[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) put(y, r, N, c * kBlockCols, out[r][c]);
}

// Blocks [b, b + C) of a part: rows in tiles of up to kGgufRowBlock, about 8-16 independent chains each.
template <GgufType T, int C, typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_direct(const c10::BFloat16* x, int64_t M, int64_t K, const float* xsum16,
                                         const uint8_t* block, int64_t block_bytes, int64_t meta_area, Out y,
                                         int64_t N, const uint8_t* end) {
  const int64_t sums_stride = K / 16;
  for (int64_t m = 0; m < M; m += kGgufRowBlock) {
    const c10::BFloat16* xr = x + m * K;
    const float* sr = xsum16 + m * sums_stride;
    const Out yr = offset(y, m, N, 0);
    switch (std::min<int64_t>(kGgufRowBlock, M - m)) {
      case 4: gguf_tile<T, 4, C, 2>(xr, K, sr, block, block_bytes, meta_area, yr, N, end); break;
      case 3: gguf_tile<T, 3, C, 1>(xr, K, sr, block, block_bytes, meta_area, yr, N, end); break;
      case 2: gguf_tile<T, 2, C, 2>(xr, K, sr, block, block_bytes, meta_area, yr, N, end); break;
      default: gguf_tile<T, 1, C, 4>(xr, K, sr, block, block_bytes, meta_area, yr, N, end); break;
    }
  }
}

// C column blocks unpacked, 16 lanes an entry: panel entry (g * pairs + i) * C + c the bf16 pairs, so entries
// (g * C + c) * 2 and + 1 the group's S and O.
template <GgufType T, int C>
FOLO_TARGET_AVX512_BF16 void gguf_unpack(const uint8_t* block, int64_t block_bytes, int64_t meta_area, int64_t K,
                                         int32_t* panel, float* so) {
  using F = GgufBf16<T>;
  const int64_t groups = K / F::kGroupK;
  for (int64_t g = 0; g < groups; ++g)
    for (int c = 0; c < C; ++c) {
      const uint8_t* b = block + c * block_bytes;
      const uint8_t* at = b + meta_area + g * F::kGroupBytes;
      const __m512i hi = F::start(at, b + block_bytes);
      __m512i lo = _mm512_setzero_si512();
      int32_t* to = panel + (g * F::kPairs * C + c) * 16;
#define GGUF_UNPACK(I)                                                                  \
  if constexpr (I < F::kPairs) {                                                        \
    F::template next_chunk<I>(at, lo);                                                  \
    _mm512_storeu_si512(to + (I) * C * 16, (__m512i)F::template pair<I>(at, lo, hi));   \
  }
      GGUF_UNPACK(0) GGUF_UNPACK(1) GGUF_UNPACK(2) GGUF_UNPACK(3) GGUF_UNPACK(4) GGUF_UNPACK(5) GGUF_UNPACK(6)
      GGUF_UNPACK(7) GGUF_UNPACK(8) GGUF_UNPACK(9) GGUF_UNPACK(10) GGUF_UNPACK(11) GGUF_UNPACK(12) GGUF_UNPACK(13)
      GGUF_UNPACK(14) GGUF_UNPACK(15)
#undef GGUF_UNPACK
      __m512 S, O;
      F::scale(b, g, S, O);
      _mm512_storeu_ps(so + (g * C + c) * 32, S);
      _mm512_storeu_ps(so + (g * C + c) * 32 + 16, O);
    }
}

// R rows x C column blocks over an unpacked panel.
template <GgufType T, int R, int C, typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_panel_tile(const c10::BFloat16* x, int64_t K, const float* xsum16,
                                             const int32_t* panel, const float* so, Out y, int64_t N) {
  using F = GgufBf16<T>;
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  const int32_t* xw = reinterpret_cast<const int32_t*>(x);
  const int64_t x_stride = K / 2, sums_stride = K / 16, groups = K / F::kGroupK;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int32_t* pg = panel + g * F::kPairs * C * 16;
    const int32_t* xg = xw + g * F::kPairs;
    for (int i = 0; i < F::kPairs; ++i) {
      __m512bh w[C];
      for (int c = 0; c < C; ++c) w[c] = (__m512bh)_mm512_loadu_si512(pg + (i * C + c) * 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(xg[r * x_stride + i]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], w[c], xv);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 S = _mm512_loadu_ps(so + (g * C + c) * 32), O = _mm512_loadu_ps(so + (g * C + c) * 32 + 16);
      for (int r = 0; r < R; ++r) {
        out[r][c] = _mm512_fmadd_ps(S, acc[r][c], out[r][c]);
        if constexpr (F::kOffset)
          out[r][c] = _mm512_fmadd_ps(O, _mm512_set1_ps(F::xsum(xsum16 + r * sums_stride, g)), out[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) put(y, r, N, c * kBlockCols, out[r][c]);
}

template <GgufType T, int C, typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_panel(const c10::BFloat16* x, int64_t M, int64_t K, const float* xsum16,
                                        const uint8_t* block, int64_t block_bytes, int64_t meta_area, Out y,
                                        int64_t N) {
  using F = GgufBf16<T>;
  thread_local std::vector<int32_t> panel;  // grown once per thread, not per call
  thread_local std::vector<float> so;
  const int64_t groups = K / F::kGroupK;
  panel.resize(groups * F::kPairs * C * 16);
  so.resize(groups * C * 32);
  gguf_unpack<T, C>(block, block_bytes, meta_area, K, panel.data(), so.data());
  const int64_t sums_stride = K / 16;
  for (int64_t m = 0; m < M; m += kGgufPanelTileRows) {
    const c10::BFloat16* xr = x + m * K;
    const float* sr = xsum16 + m * sums_stride;
    const Out yr = offset(y, m, N, 0);
    const int32_t* p = panel.data();
    const float* s = so.data();
    switch (std::min<int64_t>(kGgufPanelTileRows, M - m)) {
      case 6: gguf_panel_tile<T, 6, C>(xr, K, sr, p, s, yr, N); break;
      case 5: gguf_panel_tile<T, 5, C>(xr, K, sr, p, s, yr, N); break;
      case 4: gguf_panel_tile<T, 4, C>(xr, K, sr, p, s, yr, N); break;
      case 3: gguf_panel_tile<T, 3, C>(xr, K, sr, p, s, yr, N); break;
      case 2: gguf_panel_tile<T, 2, C>(xr, K, sr, p, s, yr, N); break;
      default: gguf_panel_tile<T, 1, C>(xr, K, sr, p, s, yr, N); break;
    }
  }
}

template <GgufType T, typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_typed_blocks(const GgufPartView& part, int64_t b0, int64_t b1,
                                               const c10::BFloat16* x, int64_t M, int64_t K, const float* xsum16,
                                               Out y, int64_t N) {
  const uint8_t* end = part.data + b1 * part.block_bytes;  // this thread's last weight byte of the part, + 1
  for (int64_t b = b0; b < b1; b += kGgufCols) {
    const uint8_t* block = part.data + b * part.block_bytes;
    const Out yb = offset(y, 0, N, part.col0 + b * kBlockCols);
    const bool pair = b + 1 < b1;
    if (M >= kGgufPanelRows) {
      if (pair) gguf_panel<T, 2>(x, M, K, xsum16, block, part.block_bytes, part.meta_area, yb, N);
      else gguf_panel<T, 1>(x, M, K, xsum16, block, part.block_bytes, part.meta_area, yb, N);
    } else {
      if (pair) gguf_direct<T, 2>(x, M, K, xsum16, block, part.block_bytes, part.meta_area, yb, N, end);
      else gguf_direct<T, 1>(x, M, K, xsum16, block, part.block_bytes, part.meta_area, yb, N, end);
    }
  }
}

// Column blocks [b0, b1) of one part of y [M, N] from bf16 x [M, K] and its sums per 16 inputs [M, K / 16].
// Out: float* or c10::BFloat16* (y itself), or ArgmaxRows (each row's best logit, y never written;
// quant_int8.h), a column block's outputs handed over in increasing columns for each row.
template <typename Out>
FOLO_TARGET_AVX512_BF16 void gguf_blocks_bf16(const GgufPartView& part, int64_t b0, int64_t b1,
                                              const c10::BFloat16* x, int64_t M, int64_t K, const float* xsum16,
                                              Out y, int64_t N) {
  switch (static_cast<GgufType>(part.type)) {
    case GgufType::kQ4_0: gguf_typed_blocks<GgufType::kQ4_0>(part, b0, b1, x, M, K, xsum16, y, N); break;
    case GgufType::kQ4_1: gguf_typed_blocks<GgufType::kQ4_1>(part, b0, b1, x, M, K, xsum16, y, N); break;
    case GgufType::kQ8_0: gguf_typed_blocks<GgufType::kQ8_0>(part, b0, b1, x, M, K, xsum16, y, N); break;
    case GgufType::kQ4_K: gguf_typed_blocks<GgufType::kQ4_K>(part, b0, b1, x, M, K, xsum16, y, N); break;
    case GgufType::kQ5_K: gguf_typed_blocks<GgufType::kQ5_K>(part, b0, b1, x, M, K, xsum16, y, N); break;
    case GgufType::kQ6_K: gguf_typed_blocks<GgufType::kQ6_K>(part, b0, b1, x, M, K, xsum16, y, N); break;
  }
}

}  // namespace
}  // namespace folovllm::cpu
