// Causal attention over fresh prefill chunks (no cached context): the torch.ops.folovllm.prefill_attention op
// (registered with the paged kernel's, attention.cpp). Three forms on one thread team (run_prefill_team): at
// the avx512_bf16 tier, bf16 with vdpbf16ps (below); at the amx tier, the same with Q K^T and P V on the tile
// unit (attention_prefill_amx.h); at the avx2 and avx512 tiers, fp32 FMAs on fp32 or bf16 inputs
// (tiered/attention_prefill.cpp). The bf16 dot-product form:
//
// A fresh chunk's K/V are contiguous already (q [T, Hq, D], k and v [T, Hkv, D], rows may be strided).
// Each (chunk, kv head) first has its keys and values reordered into tiles of kTile keys laid out for
// vdpbf16ps, whose pairs of bf16 products accumulate in fp32:
//   keys   [tile][D/2 pairs of dims][kTile keys][2]: a broadcast pair of q dims times 16 keys per zmm
//   values [tile][kTile/2 pairs of keys][D][2]:       a broadcast pair of probabilities times 16 dims
// Then each work item, kTile query rows of one query head, walks the key tiles up to its diagonal
// (causal: later tiles are skipped whole, the diagonal one masked) with an online softmax: scores
// Q K^T in fp32, exp in fp32, probabilities rounded to bf16 for P V (as torch's bf16 flash attention
// does), fp32 row sums and accumulators. Items run heaviest first on an OpenMP team of at most
// torch.get_num_threads() threads.
#pragma once

#include "attention_prefill_amx.h"
#include "simd.h"
#include "isa.h"
#include "tiered.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace folovllm::cpu {
namespace {

constexpr int64_t kTile = 64;  // query rows per item and keys per tile

struct PrefillChunk {
  int64_t start;  // first row in q/k/v/out
  int64_t len;
};

struct PrefillProblem {
  const uint16_t* q;  // [T, Hq, D], row stride q_stride
  const uint16_t* k;  // [T, Hkv, D], row stride k_stride
  const uint16_t* v;
  uint16_t* out;      // [T, Hq, D] contiguous
  int64_t q_stride, k_stride, v_stride;
  int64_t num_heads, num_kv_heads, head_dim;
  float scale;
};


// Keys and values of one (chunk, kv head), reordered as the header says; tiles past the chunk's
// end are zero (their scores are masked, and zero values keep 0 * value finite).
FOLO_TARGET_AVX512_BF16 void pack_kv(const PrefillProblem& p, const PrefillChunk& c, int64_t kv_head,
                                   uint16_t* keys, uint16_t* values) {
  const int64_t D = p.head_dim, tiles = (c.len + kTile - 1) / kTile;
  std::memset(keys, 0, tiles * kTile * D * sizeof(uint16_t));
  std::memset(values, 0, tiles * kTile * D * sizeof(uint16_t));
  for (int64_t t = 0; t < c.len; ++t) {
    const uint16_t* krow = p.k + (c.start + t) * p.k_stride + kv_head * D;
    const uint16_t* vrow = p.v + (c.start + t) * p.v_stride + kv_head * D;
    const int64_t tile = t / kTile, j = t % kTile;
    uint16_t* kt = keys + tile * kTile * D;    // [D/2][kTile][2]
    uint16_t* vt = values + tile * kTile * D;  // [kTile/2][D][2]
    for (int64_t d = 0; d < D; d += 2) {
      kt[(d / 2 * kTile + j) * 2] = krow[d];
      kt[(d / 2 * kTile + j) * 2 + 1] = krow[d + 1];
    }
    uint16_t* vdst = vt + (j / 2) * D * 2 + (j % 2);
    for (int64_t d = 0; d < D; ++d) vdst[d * 2] = vrow[d];
  }
}

// scores[4 rows][kTile] = scale * q rows . keys of one packed tile; q rows are kTile-row-padded bf16
// with D/2 pairs each (as uint32).
FOLO_TARGET_AVX512_BF16 inline void score_rows4(const uint32_t* q, int64_t pairs, const __m512bh* keys, float scale,
                                              float* scores) {
  __m512 acc[4][4];
  for (int m = 0; m < 4; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh* kp = keys + p * 4;
    for (int m = 0; m < 4; ++m) {
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[m * pairs + p]));
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], qv, (__m512bh)_mm512_loadu_si512(kp + j));
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int m = 0; m < 4; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(scores + m * kTile + j * 16, _mm512_mul_ps(acc[m][j], s));
}

// acc[R rows][D] += probs[R rows][kTile keys] (bf16) . values of one packed tile; NV = D / 16.
template <int NV, int R>
FOLO_TARGET_AVX512_BF16 inline void add_values(const uint32_t* probs, const __m512bh* values, float* acc_rows) {
  constexpr int64_t D = NV * 16;
  __m512 acc[R][NV];
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_loadu_ps(acc_rows + m * D + j * 16);
  for (int64_t kp = 0; kp < kTile / 2; ++kp) {
    const __m512bh* vp = values + kp * NV;
    for (int m = 0; m < R; ++m) {
      const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(probs[m * (kTile / 2) + kp]));
      for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], pv, (__m512bh)_mm512_loadu_si512(vp + j));
    }
  }
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc_rows + m * D + j * 16, acc[m][j]);
}

struct PrefillWorkspace {
  std::vector<uint32_t> q;      // [kTile][D/2] bf16 pairs of the item's query rows
  std::vector<float> scores;    // [kTile][kTile]
  std::vector<uint32_t> probs;  // [kTile][kTile/2] bf16 pairs
  std::vector<float> acc;       // [kTile][D]
  std::vector<float> row_max, row_sum;
  explicit PrefillWorkspace(int64_t D)
      : q(kTile * D / 2), scores(kTile * kTile), probs(kTile * kTile / 2), acc(kTile * D), row_max(kTile),
        row_sum(kTile) {}
};

// The AMX form's: the tile layout loaded on the thread while it runs items.
struct AmxPrefillWorkspace : PrefillWorkspace {
  explicit AmxPrefillWorkspace(int64_t D) : PrefillWorkspace(D) { amx_configure(); }
  ~AmxPrefillWorkspace() { amx_release(); }
};

// One work item: query rows [q0, q0 + kTile) of one head of a chunk, against key tiles 0 .. q0 / kTile; Q K^T
// and P V with vdpbf16ps, or on the tile unit (kAmx).
template <int NV, bool kAmx>
FOLO_TARGET_AVX512_BF16 void attend_prefill_item(const PrefillProblem& p, const PrefillChunk& c, int64_t head,
                                               int64_t q_tile, const uint16_t* keys, const uint16_t* values,
                                               PrefillWorkspace& ws) {
  constexpr int64_t D = NV * 16, pairs = D / 2;
  constexpr int R = NV == 4 ? 4 : 2;  // rows per P V register block: R x NV accumulators
  const int64_t q0 = q_tile * kTile, rows = std::min(kTile, c.len - q0);
  for (int64_t m = 0; m < kTile; ++m) {
    uint32_t* dst = ws.q.data() + m * pairs;
    if (m < rows)
      std::memcpy(dst, p.q + (c.start + q0 + m) * p.q_stride + head * D, D * sizeof(uint16_t));
    else
      std::memset(dst, 0, D * sizeof(uint16_t));
  }
  std::fill(ws.acc.begin(), ws.acc.end(), 0.f);
  std::fill(ws.row_max.begin(), ws.row_max.end(), -std::numeric_limits<float>::infinity());
  std::fill(ws.row_sum.begin(), ws.row_sum.end(), 0.f);

  for (int64_t tile = 0; tile <= q_tile; ++tile) {
    const uint16_t* kt = keys + tile * kTile * D;
    const uint16_t* vt = values + tile * kTile * D;
    if constexpr (kAmx) {
      for (int64_t m = 0; m < kTile; m += 16)
        amx_score_rows16<kTile>(reinterpret_cast<const uint16_t*>(ws.q.data()) + m * D, D, kt, p.scale,
                                &ws.scores[m * kTile]);
    } else {
      for (int64_t m = 0; m < kTile; m += 4)
        score_rows4(ws.q.data() + m * pairs, pairs, reinterpret_cast<const __m512bh*>(kt), p.scale,
                    &ws.scores[m * kTile]);
    }
    const bool diagonal = tile == q_tile;
    for (int64_t m = 0; m < kTile; ++m) {
      float* s = &ws.scores[m * kTile];
      // on the diagonal tile row m sees keys 0..m of it
      const uint64_t visible = !diagonal || m == kTile - 1 ? ~uint64_t{0} : (uint64_t{2} << m) - 1;
      __m512 v[4];
      __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm512_loadu_ps(s + j * 16);
        top = _mm512_mask_max_ps(top, static_cast<__mmask16>(visible >> (16 * j)), top, v[j]);
      }
      const float old_max = ws.row_max[m];
      const float new_max = std::max(old_max, _mm512_reduce_max_ps(top));
      const float correction = old_max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(old_max - new_max);
      ws.row_max[m] = new_max;
      const __m512 shift = _mm512_set1_ps(new_max);
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm512_maskz_mov_ps(static_cast<__mmask16>(visible >> (16 * j)), exp16(_mm512_sub_ps(v[j], shift)));
        sum = _mm512_add_ps(sum, v[j]);
      }
      ws.row_sum[m] = ws.row_sum[m] * correction + _mm512_reduce_add_ps(sum);
      __m512i* pr = reinterpret_cast<__m512i*>(ws.probs.data() + m * (kTile / 2));
      _mm512_storeu_si512(pr, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
      _mm512_storeu_si512(pr + 1, (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]));
      if (correction != 1.f) {
        float* a = &ws.acc[m * D];
        const __m512 cv = _mm512_set1_ps(correction);
        for (int j = 0; j < NV; ++j) _mm512_storeu_ps(a + j * 16, _mm512_mul_ps(_mm512_loadu_ps(a + j * 16), cv));
      }
    }
    if constexpr (kAmx) {
      for (int64_t m = 0; m < kTile; m += 16)
        amx_add_values16<kTile>(reinterpret_cast<const uint16_t*>(ws.probs.data()) + m * kTile, vt, D, &ws.acc[m * D]);
    } else {
      for (int64_t m = 0; m < kTile; m += R)
        add_values<NV, R>(ws.probs.data() + m * (kTile / 2), reinterpret_cast<const __m512bh*>(vt), &ws.acc[m * D]);
    }
  }

  for (int64_t m = 0; m < rows; ++m) {
    uint16_t* dst = p.out + ((c.start + q0 + m) * p.num_heads + head) * D;
    const __m512 inv = _mm512_set1_ps(1.f / ws.row_sum[m]);
    for (int j = 0; j < NV; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j * 16),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(&ws.acc[m * D + j * 16]), inv)));
  }
}

struct PrefillItem {
  int64_t chunk, head, q_tile;
};

// The thread team of both forms: pack(chunk, kv head) for every pair, then item(item, workspace) for every
// (chunk, query head, query tile of `tile` rows), heaviest first (an item's cost grows with its tile
// index), on at most torch.get_num_threads() threads, each with its own Workspace(head_dim).
template <typename Workspace, typename Pack, typename Item>
void run_prefill_team(const std::vector<PrefillChunk>& chunks, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t tile, const Pack& pack, const Item& item) {
  std::vector<PrefillItem> items;
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c)
    for (int64_t t = 0; t < (chunks[c].len + tile - 1) / tile; ++t)
      for (int64_t h = 0; h < num_heads; ++h) items.push_back({c, h, t});
  std::stable_sort(items.begin(), items.end(),
                   [](const PrefillItem& a, const PrefillItem& b) { return a.q_tile > b.q_tile; });
  const int64_t packs = static_cast<int64_t>(chunks.size()) * num_kv_heads;
  const int64_t n = static_cast<int64_t>(items.size());
  const int num_threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n)));
  int64_t next_pack = 0, next_item = 0;
#pragma omp parallel num_threads(num_threads)
  {
    for (int64_t i; (i = __atomic_fetch_add(&next_pack, 1, __ATOMIC_RELAXED)) < packs;)
      pack(i / num_kv_heads, i % num_kv_heads);
#pragma omp barrier
    Workspace ws(head_dim);
    for (int64_t i; (i = __atomic_fetch_add(&next_item, 1, __ATOMIC_RELAXED)) < n;) item(items[i], ws);
  }
}

// First packed element of each chunk's kv head 0, for `per_row` elements per padded row of a kv head.
std::vector<int64_t> pack_offsets(const std::vector<PrefillChunk>& chunks, int64_t tile, int64_t per_row,
                                  int64_t* total) {
  std::vector<int64_t> offsets;
  *total = 0;
  for (const PrefillChunk& c : chunks) {
    offsets.push_back(*total);
    *total += (c.len + tile - 1) / tile * tile * per_row;
  }
  return offsets;
}

// The bf16 dot-product forms: K/V packed as the header says, items with vdpbf16ps or (kAmx) on the tile unit.
template <bool kAmx>
void run_prefill_bf16(const PrefillProblem& p, const std::vector<PrefillChunk>& chunks) {
  using Workspace = std::conditional_t<kAmx, AmxPrefillWorkspace, PrefillWorkspace>;
  const int64_t D = p.head_dim, group = p.num_heads / p.num_kv_heads;
  int64_t total = 0;
  const std::vector<int64_t> offsets = pack_offsets(chunks, kTile, D * p.num_kv_heads, &total);
  // 64-byte aligned, as torch allocates
  const at::Tensor key_buf = at::empty({total}, at::kBFloat16), value_buf = at::empty({total}, at::kBFloat16);
  uint16_t* keys = reinterpret_cast<uint16_t*>(key_buf.mutable_data_ptr());
  uint16_t* values = reinterpret_cast<uint16_t*>(value_buf.mutable_data_ptr());
  const auto at_head = [&](int64_t c, int64_t kv_head) {
    return offsets[c] + kv_head * ((chunks[c].len + kTile - 1) / kTile * kTile) * D;
  };
  run_prefill_team<Workspace>(
      chunks, p.num_heads, p.num_kv_heads, D, kTile,
      [&](int64_t c, int64_t h) { pack_kv(p, chunks[c], h, keys + at_head(c, h), values + at_head(c, h)); },
      [&](const PrefillItem& it, Workspace& ws) {
        const int64_t at = at_head(it.chunk, it.head / group);
        if (D == 64)
          attend_prefill_item<4, kAmx>(p, chunks[it.chunk], it.head, it.q_tile, keys + at, values + at, ws);
        else
          attend_prefill_item<8, kAmx>(p, chunks[it.chunk], it.head, it.q_tile, keys + at, values + at, ws);
      });
}

struct TieredWorkspace {
  std::vector<float> floats;
  explicit TieredWorkspace(int64_t D) : floats(prefill_workspace_floats(D)) {}
};

// The fp32 form of the avx2 and avx512 tiers (tiered/attention_prefill.cpp): fp32 or bf16 q/k/v.
void run_prefill_tiered(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::vector<PrefillChunk>& chunks, float scale) {
  const int64_t D = q.size(2), Hq = q.size(1), Hkv = k.size(1), group = Hq / Hkv;
  const bool bf16 = q.scalar_type() == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
  const int64_t elem = q.element_size();
  int64_t total = 0;
  const std::vector<int64_t> offsets = pack_offsets(chunks, kPrefillTile, D * Hkv, &total);
  const at::Tensor key_buf = at::empty({total}, at::kFloat), value_buf = at::empty({total}, at::kFloat);
  float* keys = key_buf.mutable_data_ptr<float>();
  float* values = value_buf.mutable_data_ptr<float>();
  const auto at_head = [&](int64_t c, int64_t kv_head) {
    return offsets[c] + kv_head * ((chunks[c].len + kPrefillTile - 1) / kPrefillTile * kPrefillTile) * D;
  };
  const char* qp = static_cast<const char*>(q.const_data_ptr());
  const char* kp = static_cast<const char*>(k.const_data_ptr());
  const char* vp = static_cast<const char*>(v.const_data_ptr());
  char* op = static_cast<char*>(out.mutable_data_ptr());
  run_prefill_team<TieredWorkspace>(
      chunks, Hq, Hkv, D, kPrefillTile,
      [&](int64_t c, int64_t h) {
        const int64_t first = chunks[c].start;
        const void* kr = kp + (first * k.stride(0) + h * D) * elem;
        const void* vr = vp + (first * v.stride(0) + h * D) * elem;
        (wide ? avx512::prefill_pack : avx2::prefill_pack)(kr, vr, bf16, k.stride(0), v.stride(0), chunks[c].len, D,
                                                           keys + at_head(c, h), values + at_head(c, h));
      },
      [&](const PrefillItem& it, TieredWorkspace& ws) {
        const PrefillChunk& c = chunks[it.chunk];
        const int64_t row0 = c.start + it.q_tile * kPrefillTile, rows = std::min(kPrefillTile, c.len - it.q_tile * kPrefillTile);
        const void* qr = qp + (row0 * q.stride(0) + it.head * D) * elem;
        void* orow = op + (row0 * out.stride(0) + it.head * D) * elem;
        const int64_t at = at_head(it.chunk, it.head / group);
        (wide ? avx512::prefill_item : avx2::prefill_item)(qr, bf16, q.stride(0), orow, out.stride(0), rows, it.q_tile,
                                                           D, scale, keys + at, values + at, ws.floats.data());
      });
}

void check_rows_of(const at::Tensor& t, int64_t rows, int64_t heads, int64_t D, at::ScalarType dtype,
                   const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == rows && t.size(1) == heads && t.size(2) == D && t.stride(2) == 1 &&
                  t.stride(1) == D && t.scalar_type() == dtype && t.device().is_cpu(),
              "prefill_attention: ", name, " must be a ", c10::toString(dtype), " CPU [T, ", heads, ", ", D,
              "] tensor with contiguous heads (as q); got ", t.scalar_type(), " ", t.sizes(), " strides ", t.strides());
}

}  // namespace

bool prefill_attention_takes(bool bf16, int64_t head_dim) {
  if (tier_at_least(Tier::kAvx512Bf16)) return bf16 && (head_dim == 64 || head_dim == 128);
  return tier_at_least(Tier::kAvx2) && head_dim > 0 && head_dim % 16 == 0;
}

// out[start:start+len] = causal attention of q over k, v for each (start, len) chunk.
void prefill_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       at::IntArrayRef starts, at::IntArrayRef lens, double scale) {
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "prefill_attention needs the avx2 tier at least; this one is ",
              tier_name(tier()));
  TORCH_CHECK(q.dim() == 3, "prefill_attention: q must be [T, Hq, D]");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.dim() == 3 ? k.size(1) : 0;
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || q.scalar_type() == at::kFloat, "prefill_attention: q must be float32 or bfloat16");
  TORCH_CHECK(prefill_attention_takes(bf16, D), "prefill_attention at the ", tier_name(tier()), " tier takes ",
              tier_at_least(Tier::kAvx512Bf16) ? "bfloat16 with head_dim 64 or 128" : "head_dim a multiple of 16",
              "; got ", q.scalar_type(), " with head_dim ", D);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "prefill_attention: num_heads must be a multiple of num_kv_heads");
  check_rows_of(q, T, Hq, D, q.scalar_type(), "q");
  check_rows_of(k, T, Hkv, D, q.scalar_type(), "k");
  check_rows_of(v, T, Hkv, D, q.scalar_type(), "v");
  check_rows_of(out, T, Hq, D, q.scalar_type(), "out");
  TORCH_CHECK(out.is_contiguous(), "prefill_attention: out must be contiguous");
  TORCH_CHECK(starts.size() == lens.size(), "prefill_attention: starts and lens differ in length");
  std::vector<PrefillChunk> chunks;
  for (size_t i = 0; i < starts.size(); ++i) {
    TORCH_CHECK(lens[i] >= 1 && starts[i] >= 0 && starts[i] + lens[i] <= T, "prefill_attention: chunk ", i,
                " (start ", starts[i], ", length ", lens[i], ") lies outside the ", T, " rows");
    chunks.push_back({starts[i], lens[i]});
  }
  if (chunks.empty()) return;
  if (!tier_at_least(Tier::kAvx512Bf16)) return run_prefill_tiered(out, q, k, v, chunks, static_cast<float>(scale));
  const auto bits = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr()); };
  PrefillProblem p{bits(q), bits(k), bits(v), reinterpret_cast<uint16_t*>(out.mutable_data_ptr()),
                   q.stride(0), k.stride(0), v.stride(0), Hq, Hkv, D, static_cast<float>(scale)};
  if (amx_runs()) return run_prefill_bf16<true>(p, chunks);  // head_dim 64 or 128: whole C tiles of 64 dims
  run_prefill_bf16<false>(p, chunks);
}

}  // namespace folovllm::cpu
