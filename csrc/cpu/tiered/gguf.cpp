// gguf_gemm's fp32 form, built once per tier (avx2, avx512: csrc/cpu/vec.h), for CPUs without bf16 dot
// products: the GGUF-typed weights in their packed layout (gguf_layout.h) times fp32 activations.
//
// A pair of codes becomes the two bf16 values 1 + q / 2^b in one 32-bit lane, as quant_gguf.h makes them;
// widened to fp32 (a shift, a mask) they meet the activations in FMAs, even and odd codes in separate sums
// where few rows leave the pipes idle. Each group's scale S and offset O (from the file's d, sub-block
// scales and mins, in fp32) then cost two FMAs per output: sum_k x_k w_k = S sum_k x_k t_k + O sum_k x_k.
// Q8_0's byte pairs are sign-extended and converted instead, with no offset. From 12 rows on, a block is
// dequantized once into an fp32 panel (w = S t + O, one FMA a value) that 6-row tiles of FMAs share.
#include "../gguf_layout.h"
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int kBlockVecs = static_cast<int>(kGgufBlockCols) / kLanes;
constexpr int kMaxRows = 4;
constexpr int64_t kPanelRows = 12;
constexpr int kPanelTileRows = 6;
constexpr int kPanelBlocks = kBlockVecs == 1 ? 2 : 1;  // AVX-512: two 16-column blocks per panel
constexpr int kPanelVecs = kPanelBlocks * kBlockVecs;

FOLO_VINLINE VecI iset1(int32_t v) {
#if defined(__AVX512F__)
  return _mm512_set1_epi32(v);
#else
  return _mm256_set1_epi32(v);
#endif
}

// v shifted right by S bits (left by -S)
template <int S>
FOLO_VINLINE VecI shift_lanes(VecI v) {
#if defined(__AVX512F__)
  if constexpr (S > 0) return _mm512_srli_epi32(v, S);
  else if constexpr (S < 0) return _mm512_slli_epi32(v, -S);
  else return v;
#else
  if constexpr (S > 0) return _mm256_srli_epi32(v, S);
  else if constexpr (S < 0) return _mm256_slli_epi32(v, -S);
  else return v;
#endif
}

// (bits & mask) | rest
FOLO_VINLINE VecI take_bits(VecI bits, int32_t mask, VecI rest) {
#if defined(__AVX512F__)
  return _mm512_ternarylogic_epi32(bits, iset1(mask), rest, 0xEA);
#else
  return _mm256_or_si256(_mm256_and_si256(bits, iset1(mask)), rest);
#endif
}

// kLanes fp16, u8 or i8 values -> fp32
FOLO_VINLINE Vec half_vec(const uint8_t* p) {
#if defined(__AVX512F__)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}
FOLO_VINLINE Vec u8_vec(const uint8_t* p) {
#if defined(__AVX512F__)
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
}
FOLO_VINLINE Vec i8_vec(const uint8_t* p) { return vload_i8(reinterpret_cast<const int8_t*>(p)); }

// kLanes columns' byte pair (2 kLanes bytes) -> the even and odd codes as fp32.
FOLO_VINLINE void widen_pair(const uint8_t* p, Vec& even, Vec& odd) {
#if defined(__AVX512F__)
  const __m512i lanes = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  even = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(lanes, 24), 24));
  odd = _mm512_cvtepi32_ps(_mm512_srai_epi32(lanes, 8));
#else
  const __m256i lanes = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(lanes, 24), 24));
  odd = _mm256_cvtepi32_ps(_mm256_srai_epi32(lanes, 8));
#endif
}

// One type's layout as the fp32 form reads it; v: which kLanes lanes of a 16-column block.
template <GgufType T>
struct Fmt {
  static constexpr int64_t kGroupK = T == GgufType::kQ6_K ? 16 : 32;
  static constexpr int kPairs = static_cast<int>(kGroupK / 2);
  static constexpr int kChunks = kPairs / 4;
  static constexpr int64_t kGroupBytes = T == GgufType::kQ8_0 ? 512 : T == GgufType::kQ5_K ? 320
                                         : T == GgufType::kQ6_K ? 192 : 256;
  static constexpr bool kHigh = T == GgufType::kQ5_K || T == GgufType::kQ6_K;
  static constexpr bool kOffset = T != GgufType::kQ8_0;

  // A group's codes at p: the lines ahead asked for; the high bits' lanes where the type has them.
  static FOLO_VINLINE VecI start(const uint8_t* p, int v) {
    if (v == 0)
      for (int64_t line = 0; line < kGroupBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + line) + 2048, _MM_HINT_T0);
    if constexpr (kHigh) return vload_i(p + 64 * kChunks + 4 * kLanes * v);
    return iset1(0);
  }

  template <int I>
  static FOLO_VINLINE void next_chunk(const uint8_t* p, int v, VecI& lo) {
    if constexpr (T != GgufType::kQ8_0 && I % 4 == 0) lo = vload_i(p + 64 * (I / 4) + 4 * kLanes * v);
  }

  // Pair I of the group: its even and odd codes' t (1 + q / 2^b; Q8_0: q) as fp32.
  template <int I>
  static FOLO_VINLINE void pair(const uint8_t* p, int v, VecI lo, VecI hi, Vec& even, Vec& odd) {
    constexpr int c = I / 4, q = I % 4;
    if constexpr (T == GgufType::kQ8_0) {
      widen_pair(p + 32 * I + 2 * kLanes * v, even, odd);
      return;
    }
    const VecI one = iset1(0x3F803F80);
    VecI bits;
    if constexpr (T == GgufType::kQ5_K) {
      bits = take_bits(shift_lanes<4 * c + q - 6>(hi), 0x00400040, take_bits(shift_lanes<4 * q - 2>(lo), 0x003C003C, one));
    } else if constexpr (T == GgufType::kQ6_K) {
      bits = take_bits(shift_lanes<2 * (4 * c + q) - 5>(hi), 0x00600060,
                       take_bits(shift_lanes<4 * q - 1>(lo), 0x001E001E, one));
    } else {
      bits = take_bits(shift_lanes<4 * q - 3>(lo), 0x00780078, one);
    }
    even = bf16_even(bits);
    odd = bf16_odd(bits);
  }

  // S and O of group g (gguf_layout.h), lanes v.
  static FOLO_VINLINE void scale(const uint8_t* meta, int64_t g, int v, Vec& S, Vec& O) {
    const int64_t half = 2 * kLanes * v, byte = kLanes * v;
    if constexpr (T == GgufType::kQ4_0) {
      const Vec d = half_vec(meta + 32 * g + half);
      S = vmul(d, vset1(16.f));
      O = vmul(d, vset1(-24.f));
    } else if constexpr (T == GgufType::kQ4_1) {
      S = vmul(half_vec(meta + 64 * g + half), vset1(16.f));
      O = vfnma(vset1(1.f), S, half_vec(meta + 64 * g + 32 + half));  // m - S
    } else if constexpr (T == GgufType::kQ8_0) {
      S = half_vec(meta + 32 * g + half);
      O = vzero();
    } else if constexpr (T == GgufType::kQ6_K) {
      const uint8_t* sb = meta + 288 * (g >> 4);
      const Vec s = vmul(half_vec(sb + half), i8_vec(sb + 32 + 16 * (g & 15) + byte));
      S = vmul(s, vset1(64.f));
      O = vmul(s, vset1(-96.f));
    } else {  // Q4_K, Q5_K
      const uint8_t* sb = meta + 320 * (g >> 3);
      const Vec s = vmul(half_vec(sb + half), u8_vec(sb + 64 + 16 * (g & 7) + byte));
      const Vec dm = vmul(half_vec(sb + 32 + half), u8_vec(sb + 192 + 16 * (g & 7) + byte));
      S = vmul(s, vset1(T == GgufType::kQ5_K ? 32.f : 16.f));
      O = vsub(vzero(), vadd(dm, S));
    }
  }

  static FOLO_VINLINE float xsum(const float* row_sums16, int64_t g) {
    if constexpr (kGroupK == 16) return row_sums16[g];
    else return row_sums16[2 * g] + row_sums16[2 * g + 1];
  }

  static FOLO_VINLINE Vec vsub(Vec a, Vec b) { return vfnma(vset1(1.f), b, a); }
};

FOLO_VINLINE void put(const LinearOut& out, int64_t at, Vec v) {
  if (out.f32 != nullptr) {
    vstore(out.f32 + at, v);
  } else {
    vstore_bf16(out.bf16 + at, v);
  }
}

// Rows x[0..R) (fp32, stride K) times C vectors from `block` (vector c: block c / kBlockVecs, lanes
// c % kBlockVecs), into y's rows from row0, columns from col0.
template <GgufType T, int R, int C>
FOLO_VINLINE void tile(const float* x, int64_t K, const float* xsum16, const uint8_t* block, int64_t block_bytes,
                       int64_t meta_area, const LinearOut& out, int64_t row0, int64_t col0) {
  using F = Fmt<T>;
  constexpr int A = R <= 2 ? 2 : 1;  // sum sets: even codes to set 0, odd to set A - 1
  Vec total[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) total[r][c] = vzero();
  const int64_t groups = K / F::kGroupK, sums_stride = K / 16;
  for (int64_t g = 0; g < groups; ++g) {
    Vec acc[A][R][C];
    for (int a = 0; a < A; ++a)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[a][r][c] = vzero();
    const uint8_t* at[C];
    VecI lo[C], hi[C];
    for (int c = 0; c < C; ++c) {
      at[c] = block + (c / kBlockVecs) * block_bytes + meta_area + g * F::kGroupBytes;
      hi[c] = F::start(at[c], c % kBlockVecs);
      lo[c] = hi[c];
    }
    const float* xg = x + g * F::kGroupK;
    auto pair = [&](auto i) {
      constexpr int I = decltype(i)::value;
      if constexpr (I < F::kPairs) {
        Vec even[C], odd[C];
        for (int c = 0; c < C; ++c) {
          F::template next_chunk<I>(at[c], c % kBlockVecs, lo[c]);
          F::template pair<I>(at[c], c % kBlockVecs, lo[c], hi[c], even[c], odd[c]);
        }
        for (int r = 0; r < R; ++r) {
          const Vec x0 = vbroadcast(xg + r * K + 2 * I), x1 = vbroadcast(xg + r * K + 2 * I + 1);
          for (int c = 0; c < C; ++c) {
            acc[0][r][c] = vfma(x0, even[c], acc[0][r][c]);
            acc[A - 1][r][c] = vfma(x1, odd[c], acc[A - 1][r][c]);
          }
        }
      }
    };
    [&]<int... I>(std::integer_sequence<int, I...>) {
      (pair(std::integral_constant<int, I>{}), ...);
    }(std::make_integer_sequence<int, 16>{});
    for (int c = 0; c < C; ++c) {
      Vec S, O;
      F::scale(block + (c / kBlockVecs) * block_bytes, g, c % kBlockVecs, S, O);
      for (int r = 0; r < R; ++r) {
        const Vec sum = A == 2 ? vadd(acc[0][r][c], acc[A - 1][r][c]) : acc[0][r][c];
        total[r][c] = vfma(S, sum, total[r][c]);
        if constexpr (F::kOffset) total[r][c] = vfma(O, vset1(F::xsum(xsum16 + r * sums_stride, g)), total[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) put(out, (row0 + r) * out.N + col0 + c * kLanes, total[r][c]);
}

template <GgufType T, int C>
FOLO_VINLINE void row_tiles(const float* x, int64_t M, int64_t K, const float* xsum16, const uint8_t* block,
                            int64_t block_bytes, int64_t meta_area, const LinearOut& out, int64_t col0) {
  const int64_t sums_stride = K / 16;
  for (int64_t m = 0; m < M; m += kMaxRows) {
    const float* xr = x + m * K;
    const float* sr = xsum16 + m * sums_stride;
    switch (std::min<int64_t>(kMaxRows, M - m)) {
      case 4: tile<T, 4, C>(xr, K, sr, block, block_bytes, meta_area, out, m, col0); break;
      case 3: tile<T, 3, C>(xr, K, sr, block, block_bytes, meta_area, out, m, col0); break;
      case 2: tile<T, 2, C>(xr, K, sr, block, block_bytes, meta_area, out, m, col0); break;
      default: tile<T, 1, C>(xr, K, sr, block, block_bytes, meta_area, out, m, col0); break;
    }
  }
}

// nblocks blocks dequantized into panel [k][kPanelVecs vectors]: w = S t + O.
template <GgufType T>
void dequantize_panel(const uint8_t* block, int64_t block_bytes, int64_t meta_area, int64_t K, int nblocks,
                      float* panel) {
  using F = Fmt<T>;
  const int64_t groups = K / F::kGroupK;
  for (int blk = 0; blk < nblocks; ++blk)
    for (int64_t g = 0; g < groups; ++g)
      for (int v = 0; v < kBlockVecs; ++v) {
        const uint8_t* b = block + blk * block_bytes;
        Vec S, O;
        F::scale(b, g, v, S, O);
        const uint8_t* at = b + meta_area + g * F::kGroupBytes;
        const VecI hi = F::start(at, v);
        VecI lo = hi;
        float* col = panel + (blk * kBlockVecs + v) * kLanes + g * F::kGroupK * kPanelVecs * kLanes;
        auto pair = [&](auto i) {
          constexpr int I = decltype(i)::value;
          if constexpr (I < F::kPairs) {
            Vec even, odd;
            F::template next_chunk<I>(at, v, lo);
            F::template pair<I>(at, v, lo, hi, even, odd);
            vstore(col + (2 * I) * kPanelVecs * kLanes, vfma(even, S, O));
            vstore(col + (2 * I + 1) * kPanelVecs * kLanes, vfma(odd, S, O));
          }
        };
        [&]<int... I>(std::integer_sequence<int, I...>) {
          (pair(std::integral_constant<int, I>{}), ...);
        }(std::make_integer_sequence<int, 16>{});
      }
}

// Rows x[0..R) (stride K) times C vectors of the panel.
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
    for (int c = 0; c < C; ++c) put(out, (row0 + r) * out.N + col0 + c * kLanes, acc[r][c]);
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

template <GgufType T>
void typed_blocks(const float* x, int64_t M, int64_t K, const float* xsum16, const uint8_t* data, int64_t block_bytes,
                  int64_t meta_area, const LinearOut& out, int64_t col0, int64_t b0, int64_t b1) {
  if (M >= kPanelRows) {
    thread_local std::vector<float> panel;  // grown once per thread, not per call
    panel.resize(static_cast<size_t>(K) * kPanelVecs * kLanes);
    for (int64_t b = b0; b < b1; b += kPanelBlocks) {
      const int nblocks = static_cast<int>(std::min<int64_t>(kPanelBlocks, b1 - b));
      dequantize_panel<T>(data + b * block_bytes, block_bytes, meta_area, K, nblocks, panel.data());
      if (nblocks * kBlockVecs == kPanelVecs) {
        panel_rows<kPanelVecs>(x, M, K, panel.data(), out, col0 + b * kGgufBlockCols);
      } else {
        panel_rows<kBlockVecs>(x, M, K, panel.data(), out, col0 + b * kGgufBlockCols);
      }
    }
    return;
  }
  for (int64_t b = b0; b < b1;) {
    const uint8_t* block = data + b * block_bytes;
    if (b + 1 < b1 && kBlockVecs == 1) {  // AVX-512: two blocks at a time
      row_tiles<T, 2 * kBlockVecs>(x, M, K, xsum16, block, block_bytes, meta_area, out, col0 + b * kGgufBlockCols);
      b += 2;
    } else {
      row_tiles<T, kBlockVecs>(x, M, K, xsum16, block, block_bytes, meta_area, out, col0 + b * kGgufBlockCols);
      b += 1;
    }
  }
}

}  // namespace

void gguf_blocks(int64_t type, const float* x, int64_t M, int64_t K, const float* xsum16, const uint8_t* data,
                 int64_t block_bytes, int64_t meta_area, const LinearOut& out, int64_t col0, int64_t b0, int64_t b1) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kQ4_0: typed_blocks<GgufType::kQ4_0>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
    case GgufType::kQ4_1: typed_blocks<GgufType::kQ4_1>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
    case GgufType::kQ8_0: typed_blocks<GgufType::kQ8_0>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
    case GgufType::kQ4_K: typed_blocks<GgufType::kQ4_K>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
    case GgufType::kQ5_K: typed_blocks<GgufType::kQ5_K>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
    case GgufType::kQ6_K: typed_blocks<GgufType::kQ6_K>(x, M, K, xsum16, data, block_bytes, meta_area, out, col0, b0, b1); break;
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
