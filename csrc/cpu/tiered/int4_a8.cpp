// W4A8 built once per tier (avx2, avx512: csrc/cpu/vec.h), for CPUs without AVX512_VNNI: the int4 matmul
// with the activations rounded to int8 per row and group, exactly as quant_int4_a8.h describes (same
// rounding, same nibble order, same epilogue), the byte dot products made of two instructions a
// VNNI CPU does in one: maddubs (unsigned codes x signed activations, adjacent pairs summed into int16)
// and madd with ones (int16 pairs into int32). No sum can overflow (|a| <= 127, q <= 15: a pair's low-
// and high-nibble int16 sums stay under 7,700), so the integer sums, and with them the outputs, are
// those of the VNNI form bit for bit.
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kBlockCols = 16;
constexpr int64_t kChunkK = 8;
constexpr int kBlockVecs = static_cast<int>(kBlockCols) / kLanes;
constexpr int kMaxRows = 4;

#if defined(__AVX512F__)
FOLO_VINLINE VecI iset1(int32_t v) { return _mm512_set1_epi32(v); }
FOLO_VINLINE VecI iand(VecI a, VecI b) { return _mm512_and_si512(a, b); }
FOLO_VINLINE VecI isrl4(VecI a) { return _mm512_srli_epi32(a, 4); }
FOLO_VINLINE VecI iadd32(VecI a, VecI b) { return _mm512_add_epi32(a, b); }
FOLO_VINLINE VecI izero() { return _mm512_setzero_si512(); }
// (lo . alo + hi . ahi) per 4 bytes, into int32 lanes
FOLO_VINLINE VecI dot4(VecI lo, VecI alo, VecI hi, VecI ahi) {
  const VecI pairs = _mm512_add_epi16(_mm512_maddubs_epi16(lo, alo), _mm512_maddubs_epi16(hi, ahi));
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}
FOLO_VINLINE Vec itof(VecI a) { return _mm512_cvtepi32_ps(a); }
#else
FOLO_VINLINE VecI iset1(int32_t v) { return _mm256_set1_epi32(v); }
FOLO_VINLINE VecI iand(VecI a, VecI b) { return _mm256_and_si256(a, b); }
FOLO_VINLINE VecI isrl4(VecI a) { return _mm256_srli_epi32(a, 4); }
FOLO_VINLINE VecI iadd32(VecI a, VecI b) { return _mm256_add_epi32(a, b); }
FOLO_VINLINE VecI izero() { return _mm256_setzero_si256(); }
FOLO_VINLINE VecI dot4(VecI lo, VecI alo, VecI hi, VecI ahi) {
  const VecI pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
FOLO_VINLINE Vec itof(VecI a) { return _mm256_cvtepi32_ps(a); }
#endif

FOLO_VINLINE Vec load_scale(const float* p) { return vload(p); }
FOLO_VINLINE Vec load_scale(const uint16_t* p) { return vload_bf16(p); }

// R rows x C column vectors (vector c: block c / kBlockVecs, lane group c % kBlockVecs), all of K.
template <int R, int C, typename S>
FOLO_VINLINE void tile(const int8_t* a, int64_t K, const float* scale, const float* sum, int64_t groups,
                       const uint32_t* codes, int64_t block_stride, const S* scales, const S* zeros, int64_t sz_stride,
                       int64_t group_size, const LinearOut& out, int64_t row0, int64_t col0) {
  Vec total[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) total[r][c] = vzero();
  const VecI low = iset1(0x0F0F0F0F);
  const int32_t* aw = reinterpret_cast<const int32_t*>(a);  // 4 activations per int32, 2 per chunk
  const int64_t a_stride = K / 4, chunks_per_group = group_size / kChunkK, chunks = K / kChunkK;
  for (int64_t g = 0; g < groups; ++g) {
    VecI acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = izero();
    const int64_t ch1 = std::min(chunks, (g + 1) * chunks_per_group);
    for (int64_t ch = g * chunks_per_group; ch < ch1; ++ch) {
      VecI lo[C], hi[C];
      for (int c = 0; c < C; ++c) {
        const uint32_t* at = codes + (c / kBlockVecs) * block_stride + ch * kBlockCols + (c % kBlockVecs) * kLanes;
        _mm_prefetch(reinterpret_cast<const char*>(at) + 2048, _MM_HINT_T0);
        const VecI lanes = vload_i(at);
        lo[c] = iand(lanes, low);
        hi[c] = iand(isrl4(lanes), low);
      }
      for (int r = 0; r < R; ++r) {
        const VecI alo = iset1(aw[r * a_stride + 2 * ch]), ahi = iset1(aw[r * a_stride + 2 * ch + 1]);
        for (int c = 0; c < C; ++c) acc[r][c] = iadd32(acc[r][c], dot4(lo[c], alo, hi[c], ahi));
      }
    }
    for (int c = 0; c < C; ++c) {
      const int64_t sz = (c / kBlockVecs) * sz_stride + g * kBlockCols + (c % kBlockVecs) * kLanes;
      const Vec s = load_scale(scales + sz), z = load_scale(zeros + sz);
      const Vec offset = vfnma(s, vset1(8.f), z);  // z - 8 s
      for (int r = 0; r < R; ++r) {
        const Vec sd = vmul(s, vset1(scale[r * groups + g]));
        total[r][c] = vfma(sd, itof(acc[r][c]), total[r][c]);
        total[r][c] = vfma(offset, vset1(sum[r * groups + g]), total[r][c]);
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
FOLO_VINLINE void row_tiles(const int8_t* a, int64_t M, int64_t K, const float* scale, const float* sum,
                            int64_t groups, const uint32_t* codes, int64_t block_stride, const S* scales,
                            const S* zeros, int64_t sz_stride, int64_t group_size, const LinearOut& out,
                            int64_t col0) {
  for (int64_t m = 0; m < M; m += kMaxRows) {
    const int8_t* ar = a + m * K;
    const float* dr = scale + m * groups;
    const float* sr = sum + m * groups;
    switch (std::min<int64_t>(kMaxRows, M - m)) {
      case 4: tile<4, C>(ar, K, dr, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      case 3: tile<3, C>(ar, K, dr, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      case 2: tile<2, C>(ar, K, dr, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
      default: tile<1, C>(ar, K, dr, sr, groups, codes, block_stride, scales, zeros, sz_stride, group_size, out, m, col0); break;
    }
  }
}

template <typename S>
void blocks(const int8_t* a, int64_t M, int64_t K, const float* scale, const float* sum, int64_t groups,
            const uint32_t* codes, const S* scales, const S* zeros, int64_t group_size, const LinearOut& out,
            int64_t b0, int64_t b1) {
  const int64_t block_stride = (K / kChunkK) * kBlockCols, sz_stride = groups * kBlockCols;
  for (int64_t b = b0; b < b1;) {  // two blocks at a time where they fill no more than 4 vectors
    const uint32_t* cb = codes + b * block_stride;
    const S* sb = scales + b * sz_stride;
    const S* zb = zeros + b * sz_stride;
    if (b + 1 < b1 && (kBlockVecs == 1 || M == 1)) {
      row_tiles<2 * kBlockVecs>(a, M, K, scale, sum, groups, cb, block_stride, sb, zb, sz_stride, group_size, out,
                                b * kBlockCols);
      b += 2;
    } else {
      row_tiles<kBlockVecs>(a, M, K, scale, sum, groups, cb, block_stride, sb, zb, sz_stride, group_size, out,
                            b * kBlockCols);
      b += 1;
    }
  }
}

}  // namespace

void int4_a8_quantize(const float* x, int64_t M, int64_t K, int64_t group_size, int8_t* a, float* scale,
                      float* sum) {
  static constexpr int kOrder[kChunkK] = {0, 4, 1, 5, 2, 6, 3, 7};  // the nibble order of a packed lane
  const int64_t groups = (K + group_size - 1) / group_size;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group_size, k1 = std::min(K, k0 + group_size);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      int32_t total = 0;
      for (int64_t k = k0; k < k1; k += kChunkK)
        for (int j = 0; j < kChunkK; ++j) {
          const int32_t q = static_cast<int32_t>(std::nearbyint(row[k + kOrder[j]] * inv));  // to nearest even
          a[m * K + k + j] = static_cast<int8_t>(q);
          total += q;
        }
      scale[m * groups + g] = d;
      sum[m * groups + g] = d * static_cast<float>(total);
    }
  }
}

void int4_a8_blocks(const int8_t* a, int64_t M, int64_t K, const float* scale, const float* sum, int64_t groups,
                    const uint32_t* codes, const void* scales, const void* zeros, bool bf16_scales,
                    int64_t group_size, const LinearOut& out, int64_t b0, int64_t b1) {
  if (bf16_scales) {
    blocks(a, M, K, scale, sum, groups, codes, static_cast<const uint16_t*>(scales),
           static_cast<const uint16_t*>(zeros), group_size, out, b0, b1);
  } else {
    blocks(a, M, K, scale, sum, groups, codes, static_cast<const float*>(scales), static_cast<const float*>(zeros),
           group_size, out, b0, b1);
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
