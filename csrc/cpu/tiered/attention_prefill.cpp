// Causal attention over fresh prefill chunks in fp32 FMAs, for the tiers without bf16 dot products
// (attention_prefill.h runs the packing and the work items on a thread team; the avx512_bf16 tier has its
// own vdpbf16ps form there). fp32 or bf16 q/k/v: K and V are widened to fp32 once per (chunk, kv head):
//   keys   [tile][dim][kPrefillTile]: one query dim broadcast times kLanes keys per FMA
//   values [row][dim]:               one probability broadcast times kLanes dims per FMA
// An item, kPrefillTile query rows of one head, walks the key tiles up to its diagonal with an online
// softmax, all in fp32 (probabilities are not rounded, unlike the bf16 dot-product form).
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace folovllm::cpu::FOLO_TIER {
namespace {

constexpr int64_t kTile = kPrefillTile;
// Register blocks of twelve accumulators (two FMA pipes of four cycles' latency need eight at least; AVX2 has
// sixteen registers): scores kRows query rows x kKeyVecs key vectors, P V kRows rows x 2 vectors of dims.
constexpr int kRows = kLanes == 8 ? 6 : 4;
constexpr int kKeyVecs = kLanes == 8 ? 2 : 3;
static_assert(kTile % (kKeyVecs * kLanes) == 0 && kTile % kRows == 0, "a tile is whole register blocks");

FOLO_VINLINE float element(const void* p, bool bf16, int64_t i) {
  return bf16 ? bf16_scalar(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// scores[kRows][kKeyVecs * kLanes] of query rows q (fp32, pre-scaled, row stride dim) against the keys of
// one packed tile starting at key column j0.
FOLO_VINLINE void score_block(const float* q, const float* keys, int64_t dim, int64_t j0, float* scores) {
  Vec acc[kRows][kKeyVecs];
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < kKeyVecs; ++n) acc[r][n] = vzero();
  for (int64_t d = 0; d < dim; ++d) {
    Vec k[kKeyVecs];
    for (int n = 0; n < kKeyVecs; ++n) k[n] = vload(keys + d * kTile + j0 + n * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec qv = vbroadcast(q + r * dim + d);
      for (int n = 0; n < kKeyVecs; ++n) acc[r][n] = vfma(qv, k[n], acc[r][n]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < kKeyVecs; ++n) vstore(scores + r * kTile + j0 + n * kLanes, acc[r][n]);
}

// acc[kRows][dim] (columns [d0, d0 + NV kLanes)) += probs[kRows][kTile] . values of the tile's first `keys` keys
// (those past them have probability 0 for these rows).
template <int NV>
FOLO_VINLINE void add_values(const float* probs, const float* values, int64_t dim, int64_t d0, int64_t keys,
                             float* acc_rows) {
  Vec acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n] = vload(acc_rows + r * dim + d0 + n * kLanes);
  for (int64_t j = 0; j < keys; ++j) {
    Vec v[NV];
    for (int n = 0; n < NV; ++n) v[n] = vload(values + j * dim + d0 + n * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec p = vbroadcast(probs + r * kTile + j);
      for (int n = 0; n < NV; ++n) acc[r][n] = vfma(p, v[n], acc[r][n]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < NV; ++n) vstore(acc_rows + r * dim + d0 + n * kLanes, acc[r][n]);
}

}  // namespace

void prefill_pack(const void* k, const void* v, bool bf16, int64_t k_stride, int64_t v_stride, int64_t len,
                  int64_t dim, float* keys, float* values) {
  const int64_t padded = (len + kTile - 1) / kTile * kTile;
  std::memset(keys, 0, padded * dim * sizeof(float));
  std::memset(values, 0, padded * dim * sizeof(float));
  for (int64_t t = 0; t < len; ++t) {
    float* kt = keys + (t / kTile) * kTile * dim + t % kTile;
    for (int64_t d = 0; d < dim; ++d) {
      kt[d * kTile] = element(k, bf16, t * k_stride + d);
      values[t * dim + d] = element(v, bf16, t * v_stride + d);
    }
  }
}

void prefill_item(const void* q, bool bf16, int64_t q_stride, void* out, int64_t out_stride, int64_t rows,
                  int64_t q_tile, int64_t dim, float scale, const float* keys, const float* values, float* ws) {
  float* qs = ws;                      // [kTile][dim] the rows' queries, times scale
  float* scores = qs + kTile * dim;    // [kTile][kTile] scores, then probabilities
  float* acc = scores + kTile * kTile;  // [kTile][dim]
  float* row_max = acc + kTile * dim;
  float* row_sum = row_max + kTile;
  const int64_t blocks = (rows + kRows - 1) / kRows * kRows;  // rows computed: whole register blocks
  for (int64_t m = 0; m < blocks; ++m)
    for (int64_t d = 0; d < dim; ++d) qs[m * dim + d] = m < rows ? element(q, bf16, m * q_stride + d) * scale : 0.f;
  std::fill(acc, acc + blocks * dim, 0.f);
  std::fill(row_max, row_max + kTile, -std::numeric_limits<float>::infinity());
  std::fill(row_sum, row_sum + kTile, 0.f);

  for (int64_t tile = 0; tile <= q_tile; ++tile) {
    const float* kt = keys + tile * kTile * dim;
    const float* vt = values + tile * kTile * dim;
    const bool diagonal = tile == q_tile;
    // keys a block of rows [m, m + kRows) sees in this tile: on the diagonal none past its last row (the
    // scores left stale there are masked below before the softmax reads them)
    const auto seen = [&](int64_t m) { return diagonal ? std::min(kTile, m + kRows) : kTile; };
    for (int64_t m = 0; m < blocks; m += kRows)
      for (int64_t j0 = 0; j0 < seen(m); j0 += kKeyVecs * kLanes)
        score_block(qs + m * dim, kt, dim, j0, scores + m * kTile);
    for (int64_t m = 0; m < blocks; ++m) {
      float* s = scores + m * kTile;
      if (diagonal)  // row m sees keys 0..m of its own tile
        std::fill(s + m + 1, s + kTile, -std::numeric_limits<float>::infinity());
      Vec top = vload(s);
      for (int64_t j = kLanes; j < kTile; j += kLanes) top = vmax(top, vload(s + j));
      const float old_max = row_max[m], new_max = std::max(old_max, vhmax(top));
      const float correction = old_max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(old_max - new_max);
      row_max[m] = new_max;
      const Vec shift = vset1(-new_max);
      Vec sum = vzero();
      for (int64_t j = 0; j < kTile; j += kLanes) {
        const Vec p = vexp(vadd(vload(s + j), shift));  // a masked key's exp(-inf) is 0
        vstore(s + j, p);
        sum = vadd(sum, p);
      }
      row_sum[m] = row_sum[m] * correction + vhsum(sum);
      if (correction != 1.f) {
        const Vec c = vset1(correction);
        for (int64_t d = 0; d < dim; d += kLanes) vstore(acc + m * dim + d, vmul(vload(acc + m * dim + d), c));
      }
    }
    for (int64_t m = 0; m < blocks; m += kRows) {
      int64_t d0 = 0;
      for (; d0 + 2 * kLanes <= dim; d0 += 2 * kLanes)
        add_values<2>(scores + m * kTile, vt, dim, d0, seen(m), acc + m * dim);
      if (d0 < dim) add_values<1>(scores + m * kTile, vt, dim, d0, seen(m), acc + m * dim);
    }
  }

  for (int64_t m = 0; m < rows; ++m) {
    const Vec inv = vset1(1.f / row_sum[m]);
    for (int64_t d = 0; d < dim; d += kLanes) {
      const Vec o = vmul(vload(acc + m * dim + d), inv);
      if (bf16)
        vstore_bf16(static_cast<uint16_t*>(out) + m * out_stride + d, o);
      else
        vstore(static_cast<float*>(out) + m * out_stride + d, o);
    }
  }
}

}  // namespace folovllm::cpu::FOLO_TIER
