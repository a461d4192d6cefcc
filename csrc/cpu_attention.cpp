// Paged attention for CPU: reads K/V in place through the block table (no gather), online softmax
// over key tiles, fp32 accumulation. Registered as torch.ops.folovllm_cpu.paged_attention.
//
// Work items are (sequence, kv head, tile of query rows); every query head of a kv head's GQA group
// rides in the same item, so each K/V row is loaded once per item. Items run on an OpenMP team of at
// most torch.get_num_threads() threads, heaviest first, dynamically scheduled. With
// skip_fresh_prefills, chunks with no cached context are left to the caller (their K/V are already
// contiguous, where a GEMM-based kernel is faster); their output rows are not written. With
// sliding_window > 0 a query at position p sees only keys (p - sliding_window, p]; 0 means no window.
//
// Portable build: plain C++ that the compiler auto-vectorizes, compiled once per instruction set
// (target_clones) and picked at load time, so one binary is correct on any x86-64 and fast on AVX-512.
// Decode rows (one query row, head_dim 64 or 128) take AVX-512 intrinsics when the CPU has them
// (checked per call; decode_fast_path=False forces the portable path).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kLanes = 16;        // independent partial sums: the compiler maps them onto one vector
constexpr int kKeyTile = 128;     // keys per online-softmax update
constexpr int kQueryTile = 16;    // query rows per prefill work item
constexpr int kMaxDecodeRows = 4; // group heads per decode register block (4 x 128 fp32 accumulators)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FOLO_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FOLO_MULTIVERSION
#endif
#define FOLO_INLINE inline __attribute__((always_inline))

FOLO_INLINE float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

FOLO_INLINE float dot(const float* a, const float* b, int n) {
  float part[kLanes] = {};
  int d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += a[d + j] * b[d + j];
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) part[j] += part[j + width];
  return part[0] + tail;
}

// exp(x) for x <= 0 (scores minus their running max), Cephes-style: a polynomial the compiler
// vectorizes, unlike libm's expf; ~1 ulp, and exactly 0 below exp's float range.
FOLO_INLINE void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; ++i) {
    float v = std::max(x[i], -87.0f);
    float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest integer
    float r = v - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    x[i] = x[i] < -87.0f ? 0.0f : y * scale;
  }
}

struct Item {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin;  // query rows [q_begin, q_end) of the sequence's chunk
  int64_t q_end;
  int64_t cost;     // query rows x keys they read, for heaviest-first ordering
};

template <typename scalar_t>
struct Problem {
  const scalar_t* query;  // [T, Hq, D]
  const scalar_t* k_cache;  // [num_blocks, block_size, Hkv, D]
  const scalar_t* v_cache;
  scalar_t* out;  // [T, Hq, D]
  const int64_t* block_tables;  // [S, table_width]
  const int64_t* seq_lens;
  const int64_t* query_start_loc;
  int64_t table_width;
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int64_t sliding_window;  // keys a query sees, itself included; 0 = the whole context
  bool decode_fast_path;  // single-row items take attend_decode_item (AVX-512, head_dim 64 or 128)
};

// First key position a query at ``pos`` sees.
FOLO_INLINE int64_t first_visible_key(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
}

// Per-thread scratch, sized for the largest item.
struct Workspace {
  std::vector<float> q, acc, scores, keys, values, row_max, row_sum;
  std::vector<const float*> key_rows, value_rows;
  std::vector<int64_t> offsets;
  Workspace(int64_t rows, int64_t head_dim)
      : q(rows * head_dim), acc(rows * head_dim), scores(std::max<int64_t>(rows, kMaxDecodeRows) * kKeyTile),
        keys(kKeyTile * head_dim), values(kKeyTile * head_dim), row_max(rows), row_sum(rows),
        key_rows(kKeyTile), value_rows(kKeyTile), offsets(kKeyTile) {}
};

FOLO_INLINE float load(float x) { return x; }
FOLO_INLINE float load(c10::BFloat16 x) { return bf16_to_float(x.x); }

// Row pointers for cache tokens [t0, t1) of one kv head: fp32 rows are read in place, bf16 rows are
// widened into ``buf`` first.
template <typename scalar_t>
FOLO_INLINE void fetch_rows(const scalar_t* cache, const int64_t* table, const Problem<scalar_t>& p,
                            int64_t kv_head, int64_t t0, int64_t t1, float* buf, const float** rows) {
  const int64_t token_stride = p.num_kv_heads * p.head_dim;
  const int64_t d_len = p.head_dim;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = table[t / p.block_size] * p.block_size + t % p.block_size;
    const scalar_t* src = cache + slot * token_stride + kv_head * d_len;
    if constexpr (std::is_same_v<scalar_t, float>) {
      rows[t - t0] = src;
    } else {
      float* dst = buf + (t - t0) * d_len;
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
      for (int64_t d = 0; d < d_len; ++d) dst[d] = bf16_to_float(bits[d]);
      rows[t - t0] = dst;
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FOLO_HAS_AVX512_DECODE 1
#define FOLO_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

FOLO_AVX512 FOLO_INLINE __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
// bf16 -> fp32 is a 16-bit shift: widen in a register instead of through a buffer
FOLO_AVX512 FOLO_INLINE __m512 load16(const c10::BFloat16* x) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
FOLO_AVX512 FOLO_INLINE void store16(float* x, __m512 v) { _mm512_storeu_ps(x, v); }
// round to nearest even, as c10::BFloat16's conversion does (NaN aside: the kernel never makes one)
FOLO_AVX512 FOLO_INLINE void store16(c10::BFloat16* x, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// The four lane sums of part[0..3], in order.
FOLO_AVX512 FOLO_INLINE __m128 reduce4(const __m512* part) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(part[0], part[1]), _mm512_unpackhi_ps(part[0], part[1]));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(part[2], part[3]), _mm512_unpackhi_ps(part[2], part[3]));
  // per 128-bit lane: [sum0, sum1, sum2, sum3] of that lane's elements
  const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lanes), _mm512_extractf32x8_ps(lanes, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Decode fast path (AVX-512): one query row, R heads of a kv head's group, head_dim 16 * NV. q and
// the R accumulators stay in registers, K/V rows are widened as they are loaded, and each loaded
// K/V row feeds all R heads.
template <int NV, int R, typename scalar_t>
FOLO_AVX512 FOLO_INLINE void attend_decode_rows(const Problem<scalar_t>& p, const int64_t* table, int64_t kv_head,
                                                int64_t first_head, int64_t token, int64_t first_key,
                                                int64_t num_keys, float* scores, int64_t* offsets) {
  constexpr int D = NV * 16;
  const int64_t token_stride = p.num_kv_heads * D;
  const __m512 scale = _mm512_set1_ps(p.scale);
  __m512 q[R][NV], acc[R][NV];
  float row_max[R], row_sum[R];
  for (int r = 0; r < R; ++r) {
    const scalar_t* src = p.query + (token * p.num_heads + first_head + r) * D;
    for (int v = 0; v < NV; ++v) {
      q[r][v] = _mm512_mul_ps(load16(src + 16 * v), scale);
      acc[r][v] = _mm512_setzero_ps();
    }
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
  }
  for (int64_t t0 = first_key; t0 < num_keys; t0 += kKeyTile) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyTile, num_keys - t0));
    for (int i = 0; i < n; ++i) {
      const int64_t t = t0 + i;
      offsets[i] = (table[t / p.block_size] * p.block_size + t % p.block_size) * token_stride + kv_head * D;
    }
    int i = 0;
    for (; i + 4 <= n; i += 4) {  // four keys at a time share one horizontal reduction
      __m512 kv[4][NV];
      for (int j = 0; j < 4; ++j)
        for (int v = 0; v < NV; ++v) kv[j][v] = load16(p.k_cache + offsets[i + j] + 16 * v);
      for (int r = 0; r < R; ++r) {
        __m512 part[4];
        for (int j = 0; j < 4; ++j) {
          part[j] = _mm512_mul_ps(q[r][0], kv[j][0]);
          for (int v = 1; v < NV; ++v) part[j] = _mm512_fmadd_ps(q[r][v], kv[j][v], part[j]);
        }
        _mm_storeu_ps(scores + r * kKeyTile + i, reduce4(part));
      }
    }
    for (; i < n; ++i) {
      const scalar_t* k = p.k_cache + offsets[i];
      __m512 kv[NV];
      for (int v = 0; v < NV; ++v) kv[v] = load16(k + 16 * v);
      for (int r = 0; r < R; ++r) {
        __m512 part = _mm512_mul_ps(q[r][0], kv[0]);
        for (int v = 1; v < NV; ++v) part = _mm512_fmadd_ps(q[r][v], kv[v], part);
        scores[r * kKeyTile + i] = _mm512_reduce_add_ps(part);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* s = scores + r * kKeyTile;
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int i = 0; i < n; ++i) tile_max = std::max(tile_max, s[i]);
      const float new_max = std::max(row_max[r], tile_max);
      const float correction = std::exp(row_max[r] - new_max);
      row_max[r] = new_max;
      for (int i = 0; i < n; ++i) s[i] -= new_max;
      exp_inplace(s, n);
      float tile_sum = 0.f;
      for (int i = 0; i < n; ++i) tile_sum += s[i];
      row_sum[r] = row_sum[r] * correction + tile_sum;
      const __m512 c = _mm512_set1_ps(correction);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_mul_ps(acc[r][v], c);
    }
    for (int i = 0; i < n; ++i) {
      const scalar_t* val = p.v_cache + offsets[i];
      __m512 vv[NV];
      for (int v = 0; v < NV; ++v) vv[v] = load16(val + 16 * v);
      for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(scores[r * kKeyTile + i]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(w, vv[v], acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    scalar_t* dst = p.out + (token * p.num_heads + first_head + r) * D;
    const __m512 inv = _mm512_set1_ps(1.f / row_sum[r]);
    for (int v = 0; v < NV; ++v) store16(dst + 16 * v, _mm512_mul_ps(acc[r][v], inv));
  }
}

// One decode item (a single query row, every head of one kv head's group) in register blocks of at
// most kMaxDecodeRows heads (half that at head_dim 128, so the accumulators fit the 32 registers).
template <int NV, typename scalar_t>
FOLO_AVX512 __attribute__((noinline)) void attend_decode_item(const Item& item, const Problem<scalar_t>& p,
                                                              Workspace& ws) {
  constexpr int block = NV <= 4 ? kMaxDecodeRows : kMaxDecodeRows / 2;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t q_start = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_start;
  const int64_t pos = p.seq_lens[item.seq] - q_len + item.q_begin;  // the row's position: context + q_begin
  const int64_t* table = p.block_tables + item.seq * p.table_width;
  const int64_t first_key = first_visible_key(pos, p.sliding_window);
  for (int64_t g0 = 0; g0 < group; g0 += block) {
    const int64_t head = item.kv_head * group + g0;
    const int64_t token = q_start + item.q_begin;
#define FOLO_DECODE_ROWS(R) \
  attend_decode_rows<NV, R>(p, table, item.kv_head, head, token, first_key, pos + 1, ws.scores.data(), ws.offsets.data())
    switch (std::min<int64_t>(block, group - g0)) {
      case 1: FOLO_DECODE_ROWS(1); break;
      case 2: FOLO_DECODE_ROWS(2); break;
      case 3: if constexpr (block >= 3) FOLO_DECODE_ROWS(3); break;
      default: if constexpr (block >= 4) FOLO_DECODE_ROWS(4); break;
    }
#undef FOLO_DECODE_ROWS
  }
}
#endif

template <typename scalar_t>
FOLO_INLINE void attend_item(const Item& item, const Problem<scalar_t>& p, Workspace& ws) {
#ifdef FOLO_HAS_AVX512_DECODE
  if (p.decode_fast_path && item.q_end - item.q_begin == 1) {
    if (p.head_dim == 64) return attend_decode_item<4>(item, p, ws);
    if (p.head_dim == 128) return attend_decode_item<8>(item, p, ws);
  }
#endif
  const int64_t D = p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t q_start = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_start;
  const int64_t context = p.seq_lens[item.seq] - q_len;  // cached tokens before this chunk
  const int64_t num_rows = (item.q_end - item.q_begin) * group;
  const int64_t* table = p.block_tables + item.seq * p.table_width;

  // row r = (query row q_begin + r / group, head kv_head * group + r % group); scale folded into q
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t token = q_start + item.q_begin + r / group;
    const int64_t head = item.kv_head * group + r % group;
    const scalar_t* src = p.query + (token * p.num_heads + head) * D;
    for (int64_t d = 0; d < D; ++d) ws.q[r * D + d] = load(src[d]) * p.scale;
    std::fill_n(&ws.acc[r * D], D, 0.f);
    ws.row_max[r] = -std::numeric_limits<float>::infinity();
    ws.row_sum[r] = 0.f;
  }

  const int64_t num_keys = context + item.q_end;  // the last row sees keys up to context + q_end
  // the first row's window start bounds every row's: earlier keys are never read
  for (int64_t t0 = first_visible_key(context + item.q_begin, p.sliding_window); t0 < num_keys;
       t0 += kKeyTile) {
    const int64_t t1 = std::min(t0 + kKeyTile, num_keys);
    fetch_rows(p.k_cache, table, p, item.kv_head, t0, t1, ws.keys.data(), ws.key_rows.data());
    fetch_rows(p.v_cache, table, p, item.kv_head, t0, t1, ws.values.data(), ws.value_rows.data());
    for (int64_t r = 0; r < num_rows; ++r) {
      // causal: query row j sits at position context + j and sees keys up to it (and, with a
      // sliding window, from pos - sliding_window + 1 on); [lo, hi) are this tile's visible keys
      const int64_t pos = context + item.q_begin + r / group;
      const int64_t lo = std::max<int64_t>(first_visible_key(pos, p.sliding_window), t0) - t0;
      const int64_t hi = std::min(t1, pos + 1) - t0;
      if (hi <= lo) continue;
      const int64_t visible = hi - lo;
      const float* q = &ws.q[r * D];
      float* s = &ws.scores[r * kKeyTile];
      const float* const* key_rows = ws.key_rows.data() + lo;
      const float* const* value_rows = ws.value_rows.data() + lo;
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < visible; ++t) {
        s[t] = dot(q, key_rows[t], D);
        tile_max = std::max(tile_max, s[t]);
      }
      const float new_max = std::max(ws.row_max[r], tile_max);
      const float correction = std::exp(ws.row_max[r] - new_max);
      ws.row_max[r] = new_max;
      for (int64_t t = 0; t < visible; ++t) s[t] -= new_max;
      exp_inplace(s, visible);
      float tile_sum = 0.f;
      for (int64_t t = 0; t < visible; ++t) tile_sum += s[t];
      ws.row_sum[r] = ws.row_sum[r] * correction + tile_sum;
      float* acc = &ws.acc[r * D];
      if (correction != 1.f)
        for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
      for (int64_t t = 0; t < visible; ++t) {
        const float weight = s[t];
        const float* v = value_rows[t];
        for (int64_t d = 0; d < D; ++d) acc[d] += weight * v[d];
      }
    }
  }

  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t token = q_start + item.q_begin + r / group;
    const int64_t head = item.kv_head * group + r % group;
    scalar_t* dst = p.out + (token * p.num_heads + head) * D;
    const float inv = 1.f / ws.row_sum[r];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(ws.acc[r * D + d] * inv);
  }
}

// One compiled copy per instruction set; the whole item loop inlines into it.
FOLO_MULTIVERSION void attend_items_f32(const Item* items, int64_t n, const Problem<float>& p,
                                        Workspace& ws, int64_t* next) {
  for (int64_t i; (i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < n;) attend_item(items[i], p, ws);
}

FOLO_MULTIVERSION void attend_items_bf16(const Item* items, int64_t n, const Problem<c10::BFloat16>& p,
                                         Workspace& ws, int64_t* next) {
  for (int64_t i; (i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < n;) attend_item(items[i], p, ws);
}

FOLO_INLINE void attend_items(const Item* items, int64_t n, const Problem<float>& p, Workspace& ws,
                              int64_t* next) {
  attend_items_f32(items, n, p, ws, next);
}
FOLO_INLINE void attend_items(const Item* items, int64_t n, const Problem<c10::BFloat16>& p,
                              Workspace& ws, int64_t* next) {
  attend_items_bf16(items, n, p, ws, next);
}

std::vector<Item> plan_items(const int64_t* seq_lens, const int64_t* query_start_loc, int64_t num_seqs,
                             int64_t num_kv_heads, bool skip_fresh_prefills, int64_t sliding_window) {
  std::vector<Item> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
    const int64_t context = seq_lens[s] - q_len;
    if (skip_fresh_prefills && context == 0 && q_len > 1) continue;
    for (int64_t begin = 0; begin < q_len; begin += kQueryTile) {
      const int64_t end = std::min(begin + kQueryTile, q_len);
      const int64_t keys = context + end - first_visible_key(context + begin, sliding_window);
      const int64_t cost = (end - begin) * keys;
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, begin, end, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

template <typename scalar_t>
void run(const Problem<scalar_t>& p, int64_t num_seqs, bool skip_fresh_prefills) {
  const std::vector<Item> items =
      plan_items(p.seq_lens, p.query_start_loc, num_seqs, p.num_kv_heads, skip_fresh_prefills, p.sliding_window);
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) return;
  const int64_t rows = kQueryTile * (p.num_heads / p.num_kv_heads);
  const int num_threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n)));
  int64_t next = 0;
#pragma omp parallel num_threads(num_threads)
  {
    Workspace ws(rows, p.head_dim);
    attend_items(items.data(), n, p, ws, &next);
  }
}

// The decode fast path's instructions, checked on the machine that runs the kernel.
bool cpu_has_avx512() {
#ifdef FOLO_HAS_AVX512_DECODE
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

void check_int64(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous int64 CPU tensor");
}

void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& query_start_loc, double scale, bool skip_fresh_prefills,
                     int64_t sliding_window, bool decode_fast_path) {
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0: no window)");
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "query must be [T, Hq, D] and the caches "
              "[num_blocks, block_size, Hkv, D]");
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "query, out and the caches must be contiguous");
  TORCH_CHECK(query.sizes() == out.sizes() && k_cache.sizes() == v_cache.sizes(), "shape mismatch");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dtype must be float32 or bfloat16");
  TORCH_CHECK(out.scalar_type() == dtype && k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "query, out and the caches must share one dtype");
  TORCH_CHECK(query.size(2) == k_cache.size(3), "query and cache head_dim differ");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  check_int64(block_tables, "block_tables");
  check_int64(seq_lens, "seq_lens");
  check_int64(query_start_loc, "query_start_loc");
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.size(0) == num_seqs,
              "block_tables, seq_lens and query_start_loc disagree on the number of sequences");
  const int64_t* lens = seq_lens.const_data_ptr<int64_t>();
  const int64_t* starts = query_start_loc.const_data_ptr<int64_t>();
  TORCH_CHECK(starts[0] == 0 && starts[num_seqs] == query.size(0), "query_start_loc must span the query rows");
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    TORCH_CHECK(q_len >= 1 && q_len <= lens[s] && lens[s] <= block_tables.size(1) * k_cache.size(1),
                "sequence ", s, ": query_len ", q_len, ", seq_len ", lens[s], " do not fit its block table");
  }
  auto fill = [&](auto* typed) {
    using scalar_t = std::remove_pointer_t<decltype(typed)>;
    Problem<scalar_t> p{query.const_data_ptr<scalar_t>(), k_cache.const_data_ptr<scalar_t>(),
                        v_cache.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                        block_tables.const_data_ptr<int64_t>(), seq_lens.const_data_ptr<int64_t>(),
                        query_start_loc.const_data_ptr<int64_t>(), block_tables.size(1),
                        query.size(1), k_cache.size(2), query.size(2), k_cache.size(1),
                        static_cast<float>(scale), sliding_window,
                        decode_fast_path && cpu_has_avx512()};
    run(p, num_seqs, skip_fresh_prefills);
  };
  if (dtype == at::kFloat) {
    fill(static_cast<float*>(nullptr));
  } else {
    fill(static_cast<c10::BFloat16*>(nullptr));
  }
}

}  // namespace

TORCH_LIBRARY(folovllm_cpu, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor query_start_loc, float scale, bool skip_fresh_prefills, "
        "int sliding_window=0, bool decode_fast_path=True) -> ()");
}

TORCH_LIBRARY_IMPL(folovllm_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
