// Multi-LoRA on CPU, registered as torch.ops.folovllm.lora_add:
//   lora_add(out [N, O], x [N, I], row_slot [N], a, a_start, b, pieces, p_start)
//     out[n] += B_s A_s x[n] for each row n of slot s = row_slot[n] (-1: the base model alone)
//
// One call per adapted linear and step, whatever the mix of adapters: each row multiplies only its own
// adapter's A and B (tiered/lora.cpp), where the torch form (folovllm/lora/layers.py) makes a few small
// matmuls per adapter and piece. The tables hold every slot's adapter for this linear (lora/layers.py
// builds them when a slot changes): A fp32 [R, I] with slot s's rows [a_start[s], a_start[s + 1]); pieces
// int64 [P, 5] (A rows [kb, ke), outputs [lo, hi), offset into b), slot s's pieces [p_start[s],
// p_start[s + 1]); b fp32, each piece's B transposed [ke - kb, hi - lo] at its offset. Rows in parallel on
// torch's intra-op threads.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "isa.h"
#include "ops.h"
#include "tiered.h"

namespace folovllm::cpu {
namespace {

constexpr int64_t kGrainMultiplies = 1 << 16;  // per parallel chunk: below this a thread costs more than it saves

void check_tables(const at::Tensor& a, const at::Tensor& a_start, const at::Tensor& b, const at::Tensor& pieces,
                  const at::Tensor& p_start, int64_t in, int64_t out_dim) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && a.dim() == 2 && a.is_contiguous() && a.size(1) == in,
              "lora_add: a must be contiguous float32 [rows, ", in, "]; got ", a.sizes());
  TORCH_CHECK(b.scalar_type() == at::kFloat && b.dim() == 1 && b.is_contiguous(), "lora_add: b must be 1-D float32");
  for (const auto* t : {&a_start, &p_start, &pieces}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "lora_add: index tables must be contiguous int64");
  }
  TORCH_CHECK(a_start.dim() == 1 && p_start.sizes() == a_start.sizes() && a_start.size(0) >= 1,
              "lora_add: a_start and p_start must be [slots + 1]");
  TORCH_CHECK(pieces.dim() == 2 && pieces.size(1) == 5, "lora_add: pieces must be [P, 5]");
  const int64_t slots = a_start.size(0) - 1, rows = a.size(0), count = pieces.size(0);
  const int64_t *as = a_start.const_data_ptr<int64_t>(), *ps = p_start.const_data_ptr<int64_t>();
  for (int64_t s = 0; s < slots; ++s) {
    TORCH_CHECK(0 <= as[s] && as[s] <= as[s + 1] && as[s + 1] <= rows && 0 <= ps[s] && ps[s] <= ps[s + 1] &&
                    ps[s + 1] <= count, "lora_add: slot ", s, "'s ranges are out of order or out of bounds");
    for (int64_t p = ps[s]; p < ps[s + 1]; ++p) {
      const int64_t* q = pieces.const_data_ptr<int64_t>() + 5 * p;
      TORCH_CHECK(as[s] <= q[0] && q[0] <= q[1] && q[1] <= as[s + 1] && 0 <= q[2] && q[2] <= q[3] && q[3] <= out_dim &&
                      q[4] >= 0 && q[4] + (q[1] - q[0]) * (q[3] - q[2]) <= b.numel(),
                  "lora_add: piece ", p, " reaches outside its slot's A rows, the output or b");
    }
  }
}

}  // namespace

void lora_add(at::Tensor& out, const at::Tensor& x, const at::Tensor& row_slot, const at::Tensor& a,
              const at::Tensor& a_start, const at::Tensor& b, const at::Tensor& pieces, const at::Tensor& p_start) {
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "lora_add needs the avx2 tier at least; this one is ", tier_name(tier()));
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "lora_add: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "lora_add: x [N, in] and out [N, out]");
  TORCH_CHECK(x.scalar_type() == out.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "lora_add: x and out must be both float32 or both bfloat16");
  TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1, "lora_add: x and out rows must be contiguous");
  TORCH_CHECK(row_slot.scalar_type() == at::kLong && row_slot.dim() == 1 && row_slot.size(0) == x.size(0) &&
                  row_slot.is_contiguous(), "lora_add: row_slot must be int64 [N]");
  const int64_t n = x.size(0), in = x.size(1), out_dim = out.size(1), slots = a_start.size(0) - 1;
  check_tables(a, a_start, b, pieces, p_start, in, out_dim);
  const int64_t* slot_of = row_slot.const_data_ptr<int64_t>();
  const int64_t* as = a_start.const_data_ptr<int64_t>();
  int64_t widest = 0;
  for (int64_t s = 0; s < slots; ++s) widest = std::max(widest, as[s + 1] - as[s]);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(slot_of[i] >= -1 && slot_of[i] < slots, "lora_add: row ", i, " names slot ", slot_of[i], " of ", slots);
  }
  if (widest == 0 || n == 0) return;
  const LoraTables tables{a.const_data_ptr<float>(), as, b.const_data_ptr<float>(), pieces.const_data_ptr<int64_t>(),
                          p_start.const_data_ptr<int64_t>(), in};
  const bool wide = tier_at_least(Tier::kAvx512);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const int64_t grain = std::max<int64_t>(1, kGrainMultiplies / (widest * (in + out_dim)));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> ws(kLoraRowBlock * (in + widest + out_dim));
    if (bf16) {
      const auto* xs = reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>());
      auto* os = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
      if (wide) {
        avx512::lora_rows(xs, x.stride(0), os, out.stride(0), slot_of, begin, end, tables, ws.data());
      } else {
        avx2::lora_rows(xs, x.stride(0), os, out.stride(0), slot_of, begin, end, tables, ws.data());
      }
    } else if (wide) {
      avx512::lora_rows(x.const_data_ptr<float>(), x.stride(0), out.mutable_data_ptr<float>(), out.stride(0), slot_of,
                        begin, end, tables, ws.data());
    } else {
      avx2::lora_rows(x.const_data_ptr<float>(), x.stride(0), out.mutable_data_ptr<float>(), out.stride(0), slot_of,
                      begin, end, tables, ws.data());
    }
  });
}

}  // namespace folovllm::cpu
