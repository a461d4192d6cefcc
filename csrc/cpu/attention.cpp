// Paged attention for CPU: reads K/V in place through the block table (no gather), online softmax
// over key tiles, fp32 accumulation. Registered as torch.ops.folovllm.paged_attention.
//
// Work items are (sequence, kv head, tile of query rows); every query head of a kv head's GQA group
// rides in the same item, so each K/V row is loaded once per item. Items run on an OpenMP team of at
// most torch.get_num_threads() threads, heaviest first, dynamically scheduled. With
// skip_fresh_prefills, chunks with no cached context are left to the caller (their K/V are already
// contiguous, where a GEMM-based kernel is faster); their output rows are not written. With
// skip_prefills_from = n > 0, chunks of n or more query rows over cached context are left to the caller
// too (it gathers their K/V once and runs a GEMM-based attention over them). With
// sliding_window > 0 a query at position p sees only keys (p - sliding_window, p]; 0 means no window.
//
// Portable path: plain C++ that the compiler auto-vectorizes, compiled for each x86-64 level
// (FOLO_PER_LEVEL) and run at the one the tier allows. Decode rows (one query row, head_dim 32, 64 or 128)
// take AVX-512 intrinsics at the AVX-512 tier, and the per-tier decode form (tiered/attention_decode.cpp,
// head_dim a multiple of 8) below it or for other head_dims (the fast_decode switch off forces the portable path); with bf16
// caches at the AVX-512 BF16 tier they score keys with bf16 dot products (bf16_dot off widens to fp32
// instead), and prefetch the next tile's K/V rows while a tile computes (prefetch off: only the current
// tile's). These switches (KernelSwitches, isa.h) are set once for the process, not passed per call.

#include "attention.h"
#include "attention_decode.h"
#include "attention_prefill.h"
#include "ops.h"
#include "tiered.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace folovllm::cpu {
namespace {

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

// Whether single-row items take a decode form: attend_decode_item or the per-tier one (else the portable
// path below).
template <typename scalar_t>
FOLO_INLINE bool takes_decode_fast_path(const Problem<scalar_t>& p) {
  return (p.decode_fast_path && avx512_decode_fits(p.head_dim)) || p.tiered_decode;
}

// A single-row item through the per-tier decode form (tiered/attention_decode.cpp): all group heads of its
// kv heads at once.
// With prefetch_next, it looks ahead to the keys of ``next_item`` (the item this thread runs next, if any).
template <typename scalar_t>
FOLO_INLINE void attend_decode_tiered(const Item& item, const Problem<scalar_t>& p, const Item* next_item) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t q_start = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_start;
  const int64_t pos = p.seq_lens[item.seq] - q_len + item.q_begin;  // the row's position: context + q_begin
  // the row's heads of kv heads [kv_head, kv_head + kv_heads): kv_heads x group query heads from here
  const int64_t at = ((q_start + item.q_begin) * p.num_heads + item.kv_head * group) * p.head_dim;
  const PagedHead kv{p.k_cache, p.v_cache, p.block_tables + item.seq * p.table_width, p.block_size,
                     p.num_kv_heads * p.head_dim, item.kv_head * p.head_dim};
  NextKeys after{nullptr, 0, 0, 0};
  if (p.prefetch_next && next_item != nullptr)
    after = item_keys(*next_item, p.block_tables, p.table_width, p.seq_lens, p.query_start_loc, p.sliding_window);
  const PagedHead next{p.k_cache, p.v_cache, after.table, p.block_size, kv.token_stride, after.kv_head * p.head_dim};
  avx2::decode_attention(p.query + at, p.out + at, std::is_same_v<scalar_t, c10::BFloat16>, item.kv_heads, group,
                         p.head_dim, p.scale, kv, first_visible_key(pos, p.sliding_window), pos + 1,
                         p.prefetch_next ? &next : nullptr, after.first_key, after.num_keys);
}

template <typename scalar_t>
FOLO_INLINE void attend_item(const Item& item, const Problem<scalar_t>& p, Workspace& ws, const Item* next_item) {
  if (p.decode_fast_path && item.q_end - item.q_begin == 1) {
    if (p.head_dim == 32) return attend_decode_item<2>(item, p, ws, next_item);
    if (p.head_dim == 64) return attend_decode_item<4>(item, p, ws, next_item);
    if (p.head_dim == 128) return attend_decode_item<8>(item, p, ws, next_item);
  }
  if (p.tiered_decode && item.q_end - item.q_begin == 1) return attend_decode_tiered(item, p, next_item);
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
    for (int64_t d = 0; d < D; ++d) ws.q[r * D + d] = to_float(src[d]) * p.scale;
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
        s[t] = lane_dot(q, key_rows[t], D);
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

// A thread's items: it claims its next run before the last item of this one, so the decode fast path
// can prefetch the next item's first keys (prefetch_next) while it computes the current one.
template <typename scalar_t>
FOLO_INLINE void attend_claimed_items(const Item* items, int64_t n, const Problem<scalar_t>& p, Workspace& ws,
                                      int64_t* next, int num_threads) {
  // Items of a decode step take a microsecond or less, and each claim moves the shared counter's cache line
  // from the other core: claimed one at a time, two threads spent longer claiming than computing at short
  // contexts, hence runs of them (chunked_claims).
  ItemClaims claims{.next = next, .n = n, .threads = num_threads, .chunked = p.chunked_claims};
  int64_t begin, end;
  claims.claim(&begin, &end);
  while (begin < end) {
    int64_t next_begin = end, next_end = end;
    for (int64_t i = begin; i < end; ++i) {
      if (i + 1 == end) claims.claim(&next_begin, &next_end);
      const Item* following = i + 1 < end ? &items[i + 1] : next_begin < next_end ? &items[next_begin] : nullptr;
      attend_item(items[i], p, ws, following);
    }
    begin = next_begin;
    end = next_end;
  }
}

// One compiled copy per x86-64 level; the whole item loop inlines into it.
FOLO_PER_LEVEL(attend_items_f32, (const Item* items, int64_t n, const Problem<float>& p, Workspace& ws,
                                  int64_t* next, int num_threads),
               (items, n, p, ws, next, num_threads), attend_claimed_items(items, n, p, ws, next, num_threads))
FOLO_PER_LEVEL(attend_items_bf16, (const Item* items, int64_t n, const Problem<c10::BFloat16>& p, Workspace& ws,
                                   int64_t* next, int num_threads),
               (items, n, p, ws, next, num_threads), attend_claimed_items(items, n, p, ws, next, num_threads))

FOLO_INLINE void attend_items(const Item* items, int64_t n, const Problem<float>& p, Workspace& ws,
                              int64_t* next, int num_threads) {
  attend_items_f32(items, n, p, ws, next, num_threads);
}
FOLO_INLINE void attend_items(const Item* items, int64_t n, const Problem<c10::BFloat16>& p,
                              Workspace& ws, int64_t* next, int num_threads) {
  attend_items_bf16(items, n, p, ws, next, num_threads);
}

// Items, heaviest first: query tiles of a sequence times each kv head, or with whole_rows each single decode
// row times all kv heads at once (the per-tier decode form reads a token's rows of every kv head together:
// one contiguous run of the cache per token instead of one per kv head).
std::vector<Item> plan_items(const int64_t* seq_lens, const int64_t* query_start_loc, int64_t num_seqs,
                             int64_t num_kv_heads, bool skip_fresh_prefills, int64_t skip_prefills_from,
                             int64_t sliding_window, bool whole_rows) {
  std::vector<Item> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
    const int64_t context = seq_lens[s] - q_len;
    if (skip_fresh_prefills && context == 0 && q_len > 1) continue;
    if (skip_prefills_from > 0 && context > 0 && q_len >= skip_prefills_from) continue;
    for (int64_t begin = 0; begin < q_len; begin += kQueryTile) {
      const int64_t end = std::min(begin + kQueryTile, q_len);
      const int64_t keys = context + end - first_visible_key(context + begin, sliding_window);
      const int64_t cost = (end - begin) * keys;
      if (whole_rows && q_len == 1) {
        items.push_back({s, 0, begin, end, cost * num_kv_heads, num_kv_heads});
        continue;
      }
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, begin, end, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

template <typename scalar_t>
void run(const Problem<scalar_t>& p, int64_t num_seqs, bool skip_fresh_prefills, int64_t skip_prefills_from) {
  const std::vector<Item> items = plan_items(p.seq_lens, p.query_start_loc, num_seqs, p.num_kv_heads,
                                             skip_fresh_prefills, skip_prefills_from, p.sliding_window,
                                             p.tiered_decode);
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) return;
  const bool decode_only = takes_decode_fast_path(p) &&
                           std::all_of(items.begin(), items.end(),
                                       [](const Item& it) { return it.q_end - it.q_begin == 1; });
  const int64_t rows = decode_only ? 0 : kQueryTile * (p.num_heads / p.num_kv_heads);
  int64_t total_cost = 0;
  for (const Item& item : items) total_cost += item.cost;
  const int num_threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n)));
  int64_t next = 0;
  if (num_threads == 1 || total_cost < kSerialCost) {
    Workspace ws(rows, p.head_dim);
    attend_items(items.data(), n, p, ws, &next, 1);
    return;
  }
#pragma omp parallel num_threads(num_threads)
  {
    Workspace ws(rows, p.head_dim);
    attend_items(items.data(), n, p, ws, &next, num_threads);
  }
}

// Whether the per-tier decode form takes rows of this head_dim (whole AVX2 vectors).
bool tiered_decode_fits(int64_t head_dim) { return head_dim % 8 == 0; }

void check_int64(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous int64 CPU tensor");
}

}  // namespace

void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& query_start_loc, const AttentionCall& call) {
  if (kv_format_of(k_cache.scalar_type()) != 0)
    return paged_attention_quantized(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, call);
  const int64_t sliding_window = call.sliding_window, skip_prefills_from = call.skip_prefills_from;
  const KernelSwitches switches = kernel_switches();
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0: no window)");
  TORCH_CHECK(skip_prefills_from >= 0, "skip_prefills_from must be >= 0 (0: compute every chunk over context)");
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
                        static_cast<float>(call.scale), sliding_window,
                        switches.fast_decode && tier_at_least(Tier::kAvx512),
                        switches.bf16_dot && std::is_same_v<scalar_t, c10::BFloat16> &&
                            tier_at_least(Tier::kAvx512Bf16),
                        switches.prefetch, switches.chunked_claims,
                        switches.fast_decode && tiered_decode_fits(query.size(2)) &&
                            !(tier_at_least(Tier::kAvx512) && avx512_decode_fits(query.size(2)))};
    run(p, num_seqs, call.skip_fresh_prefills, skip_prefills_from);
  };
  if (dtype == at::kFloat) {
    fill(static_cast<float*>(nullptr));
  } else {
    fill(static_cast<c10::BFloat16*>(nullptr));
  }
}

}  // namespace folovllm::cpu
