// The int8 (W8A16, one scale per output column) matmul's fp32 form, built once per tier (avx2, avx512:
// csrc/cpu/vec.h), for CPUs without bf16 dot products: y[m, n] = scale[n] * sum_k x[m, k] q[n, k] over the
// codes quant_int8.h packs ([N / 16][K / 2][16 columns][2]: column j's codes k and k + 1 at bytes 2j, 2j + 1).
//
// A code pair is one 16-bit lane: sign-extended to 32 bits, an arithmetic shift right by 8 gives the odd
// code, a shift left by 24 and back the even one; converted to fp32 they meet fp32 activations in FMAs.
// Up to 4 rows read the codes directly (each byte streamed once); more rows first widen each block to an
// fp32 panel and run 6-row tiles over it. Every sum runs along K in the same order whatever the tile, so a
// row's result does not depend on its batch. The argmax form keeps each row's first largest logit (a NaN
// wins at once, as torch.argmax has it), the logits rounded to bf16 first where asked.
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kBlockCols = 16;
constexpr int kBlockVecs = static_cast<int>(kBlockCols) / kLanes;
constexpr int kDirectRows = 4;  // rows up to which the codes are read directly
constexpr int kPanelRows = 6;   // rows per tile over a widened panel

// kLanes columns' code pair at p (2 kLanes bytes) -> the even and odd codes as fp32.
FOLO_VINLINE void widen_pair(const int8_t* p, Vec& even, Vec& odd) {
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

// The weights a tile reads: vector c's even/odd codes at pair kp, from the codes (blocks `stride` bytes
// apart) or from a panel widened once ([pair][even, odd][kBlockVecs vectors]).
struct Codes {
  const int8_t* codes;
  int64_t stride;
  FOLO_VINLINE void pair(int64_t kp, int c, Vec& even, Vec& odd) const {
    widen_pair(codes + (c / kBlockVecs) * stride + kp * 2 * kBlockCols + (c % kBlockVecs) * 2 * kLanes, even, odd);
  }
};
struct Panel {
  const float* panel;
  FOLO_VINLINE void pair(int64_t kp, int c, Vec& even, Vec& odd) const {
    even = vload(panel + (2 * kp * kBlockVecs + c) * kLanes);
    odd = vload(panel + ((2 * kp + 1) * kBlockVecs + c) * kLanes);
  }
};

// acc[r][c] = sum over k of x[r][k] q[k][col], k in order; rows stride K.
template <int R, int C, typename Weights>
FOLO_VINLINE void tile(const float* x, int64_t K, const Weights& w, Vec (&out)[R][C]) {
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    for (int c = 0; c < C; ++c) {
      Vec even, odd;
      w.pair(kp, c, even, odd);
      for (int r = 0; r < R; ++r) {
        acc[r][c] = vfma(vbroadcast(x + r * K + 2 * kp), even, acc[r][c]);
        acc[r][c] = vfma(vbroadcast(x + r * K + 2 * kp + 1), odd, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

FOLO_VINLINE Vec load_scale(const float* p) { return vload(p); }
FOLO_VINLINE Vec load_scale(const uint16_t* p) { return vload_bf16(p); }

template <typename Fn>
FOLO_VINLINE void by_rows(int64_t M, int most, Fn&& fn) {
  for (int64_t m = 0; m < M; m += most) {
    switch (std::min<int64_t>(most, M - m)) {
      case 6: fn(std::integral_constant<int, 6>{}, m); break;
      case 5: fn(std::integral_constant<int, 5>{}, m); break;
      case 4: fn(std::integral_constant<int, 4>{}, m); break;
      case 3: fn(std::integral_constant<int, 3>{}, m); break;
      case 2: fn(std::integral_constant<int, 2>{}, m); break;
      default: fn(std::integral_constant<int, 1>{}, m); break;
    }
  }
}

// Blocks [b0, b1): consume(acc, m, col) gets each tile's scaled logits (rows [m, m + R), columns from col),
// in increasing columns for each row.
template <typename S, typename Consume>
void blocks(const float* x, int64_t M, int64_t K, const int8_t* codes, const S* scales, int64_t b0, int64_t b1,
            Consume&& consume) {
  const int64_t stride = K * kBlockCols;  // bytes per column block
  auto scaled = [&](auto& acc, int64_t m, int64_t col) {
    constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>, 0>;
    constexpr int C = std::extent_v<std::remove_reference_t<decltype(acc)>, 1>;
    for (int c = 0; c < C; ++c) {
      const Vec s = load_scale(scales + col + c * kLanes);
      for (int r = 0; r < R; ++r) acc[r][c] = vmul(s, acc[r][c]);
    }
    consume(acc, m, col);
  };
  if (M <= kDirectRows) {
    for (int64_t b = b0; b < b1;) {
      const Codes w{codes + b * stride, stride};
      if (M == 1 && b + 1 < b1) {  // one row: two blocks per pass, more independent sums
        Vec acc[1][2 * kBlockVecs];
        tile<1, 2 * kBlockVecs>(x, K, w, acc);
        scaled(acc, 0, b * kBlockCols);
        b += 2;
        continue;
      }
      by_rows(M, kDirectRows, [&](auto rows, int64_t m) {
        constexpr int R = decltype(rows)::value;
        Vec acc[R][kBlockVecs];
        tile<R, kBlockVecs>(x + m * K, K, w, acc);
        scaled(acc, m, b * kBlockCols);
      });
      b += 1;
    }
    return;
  }
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(K) * kBlockCols);
  for (int64_t b = b0; b < b1; ++b) {
    const Codes w{codes + b * stride, stride};
    for (int64_t kp = 0; kp < K / 2; ++kp)
      for (int c = 0; c < kBlockVecs; ++c) {
        Vec even, odd;
        w.pair(kp, c, even, odd);
        vstore(scratch.data() + (2 * kp * kBlockVecs + c) * kLanes, even);
        vstore(scratch.data() + ((2 * kp + 1) * kBlockVecs + c) * kLanes, odd);
      }
    by_rows(M, kPanelRows, [&](auto rows, int64_t m) {
      constexpr int R = decltype(rows)::value;
      Vec acc[R][kBlockVecs];
      tile<R, kBlockVecs>(x + m * K, K, Panel{scratch.data()}, acc);
      scaled(acc, m, b * kBlockCols);
    });
  }
}

template <typename Consume>
void dispatch_scales(const float* x, int64_t M, int64_t K, const int8_t* codes, const void* scales, bool bf16_scales,
                     int64_t b0, int64_t b1, Consume&& consume) {
  if (bf16_scales) {
    blocks(x, M, K, codes, static_cast<const uint16_t*>(scales), b0, b1, consume);
  } else {
    blocks(x, M, K, codes, static_cast<const float*>(scales), b0, b1, consume);
  }
}

}  // namespace

void int8_blocks(const float* x, int64_t M, int64_t K, const int8_t* codes, const void* scales, bool bf16_scales,
                 const LinearOut& out, int64_t b0, int64_t b1) {
  dispatch_scales(x, M, K, codes, scales, bf16_scales, b0, b1, [&](const auto& acc, int64_t m, int64_t col) {
    constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>, 0>;
    constexpr int C = std::extent_v<std::remove_reference_t<decltype(acc)>, 1>;
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const int64_t at = (m + r) * out.N + col + c * kLanes;
        if (out.f32 != nullptr) {
          vstore(out.f32 + at, acc[r][c]);
        } else {
          vstore_bf16(out.bf16 + at, acc[r][c]);
        }
      }
  });
}

void int8_argmax_blocks(const float* x, int64_t M, int64_t K, const int8_t* codes, const void* scales,
                        bool bf16_scales, bool round_bf16, float* best, int64_t* best_id, int64_t b0, int64_t b1) {
  dispatch_scales(x, M, K, codes, scales, bf16_scales, b0, b1, [&](const auto& acc, int64_t m, int64_t col) {
    constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>, 0>;
    constexpr int C = std::extent_v<std::remove_reference_t<decltype(acc)>, 1>;
    for (int r = 0; r < R; ++r) {
      float& top = best[m + r];
      if (top != top) continue;  // a NaN already won
      alignas(64) float values[C * kLanes], rounded[C * kLanes];
      for (int c = 0; c < C; ++c) {
        vspill(values + c * kLanes, acc[r][c]);
        vspill(rounded + c * kLanes, round_bf16 ? vround_bf16(acc[r][c]) : acc[r][c]);
      }
      for (int i = 0; i < C * kLanes; ++i) {
        if (values[i] != values[i]) {  // (bf16 rounding in integers would not keep a NaN one)
          top = values[i];
          best_id[m + r] = col + i;
          break;
        }
        if (rounded[i] > top) {
          top = rounded[i];
          best_id[m + r] = col + i;
        }
      }
    }
  });
}

}  // namespace folovllm::cpu::FOLO_TIER
