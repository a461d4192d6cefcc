// paged_attention over a quantized KV cache (kv_quant.h: int8 or fp8 codes with a float16 scale per row):
// every query row the caller leaves to the kernel goes through the per-tier decode form
// (tiered/attention_decode.cpp), which dequantizes each K/V row in registers as it reads it. A chunk's row
// at position p attends keys [first visible, p] exactly as a decode row does, so the rows of prefill chunks
// over cached context take the same form, one row at a time.
#include "attention.h"
#include "isa.h"
#include "kv_quant.h"
#include "ops.h"
#include "tiered.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace folovllm::cpu {
namespace {

struct RowItem {
  int64_t seq, kv_head, row;  // row: the query row within the sequence's chunk
};

}  // namespace

int kv_format_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kChar: return static_cast<int>(KvFormat::kInt8);
    case at::kFloat8_e4m3fn: return static_cast<int>(KvFormat::kFp8E4m3);
    case at::kFloat8_e5m2: return static_cast<int>(KvFormat::kFp8E5m2);
    default: return 0;
  }
}

void paged_attention_quantized(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                               const at::Tensor& query_start_loc, const AttentionCall& call) {
  const double scale = call.scale;
  const bool skip_fresh_prefills = call.skip_fresh_prefills;
  const int64_t sliding_window = call.sliding_window, skip_prefills_from = call.skip_prefills_from;
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "paged_attention needs the avx2 tier at least; this one is ",
              tier_name(tier()));
  TORCH_CHECK(sliding_window >= 0 && skip_prefills_from >= 0, "sliding_window and skip_prefills_from must be >= 0");
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.scalar_type() == v_cache.scalar_type(), "query must be [T, Hq, D] and the caches one "
              "[num_blocks, block_size, Hkv, D + 2] int8/fp8 shape");
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "query, out and the caches must be contiguous");
  const auto dtype = query.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && out.scalar_type() == dtype &&
              out.sizes() == query.sizes(), "query and out must be one float32 or bfloat16 shape");
  const int64_t D = query.size(2), num_heads = query.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D + kKvScaleBytes, "a quantized cache row holds head_dim codes and a 2-byte scale");
  TORCH_CHECK(D % 16 == 0, "a quantized cache needs head_dim a multiple of 16; got ", D);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &query_start_loc})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "block tables, seq_lens and query_start_loc "
                "must be contiguous int64 tensors");
  const int64_t num_seqs = seq_lens.size(0), block_size = k_cache.size(1), width = block_tables.size(1);
  const int64_t* lens = seq_lens.const_data_ptr<int64_t>();
  const int64_t* starts = query_start_loc.const_data_ptr<int64_t>();
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.size(0) == num_seqs &&
              starts[num_seqs] == query.size(0), "block_tables, seq_lens and query_start_loc disagree");
  std::vector<RowItem> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], context = lens[s] - q_len;
    TORCH_CHECK(q_len >= 1 && context >= 0 && lens[s] <= width * block_size, "sequence ", s, ": query_len ", q_len,
                ", seq_len ", lens[s], " do not fit its block table");
    if (skip_fresh_prefills && context == 0 && q_len > 1) continue;
    if (skip_prefills_from > 0 && context > 0 && q_len >= skip_prefills_from) continue;
    for (int64_t r = 0; r < q_len; ++r)
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, r});
  }
  const int format = kv_format_of(k_cache.scalar_type());
  const bool bf16 = dtype == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
  const int64_t group = num_heads / num_kv_heads, row_bytes = D + kKvScaleBytes, elem = query.element_size();
  const char* q_base = static_cast<const char*>(query.const_data_ptr());
  char* out_base = static_cast<char*>(out.mutable_data_ptr());
  const int64_t* tables = block_tables.const_data_ptr<int64_t>();
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t grain = std::max<int64_t>(1, n / (4 * at::get_num_threads()));
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const RowItem& it = items[i];
      const int64_t q_len = starts[it.seq + 1] - starts[it.seq];
      const int64_t pos = lens[it.seq] - q_len + it.row;  // the row's position
      const int64_t at = ((starts[it.seq] + it.row) * num_heads + it.kv_head * group) * D * elem;
      const PagedHead kv{k_cache.const_data_ptr(), v_cache.const_data_ptr(), tables + it.seq * width, block_size,
                         num_kv_heads * row_bytes, it.kv_head * row_bytes};
      const int64_t first = first_visible_key(pos, sliding_window);
      if (wide) {
        avx512::decode_attention_quantized(q_base + at, out_base + at, bf16, group, D, static_cast<float>(scale), kv,
                                           format, first, pos + 1);
      } else {
        avx2::decode_attention_quantized(q_base + at, out_base + at, bf16, group, D, static_cast<float>(scale), kv,
                                         format, first, pos + 1);
      }
    }
  });
}

}  // namespace folovllm::cpu
