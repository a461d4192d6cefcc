// Linear layers with bf16 weights on CPU, registered as torch.ops.folovllm.*:
//   linear_pack(weight [N, K])       the weight reordered for streaming: [N/64][K/2][64 rows][2]
//   linear(x [..., K], packed, bias) x @ weight^T (+ bias), in x's dtype (bf16 or fp32)
//
// Three forms over one packed weight. On an AMX host, bf16 x of 16 rows or more: the tile unit's form
// (linear_amx.h). At the AVX-512 BF16 tier, other bf16 x (below). At every other tier from
// avx2 on, and for fp32 x, the fp32 form (csrc/cpu/tiered/linear.cpp): bf16 x widened to fp32 by each
// thread a chunk of rows at a time, each bf16 weight pair widened in registers, FMAs into fp32 sums, the
// output rounded to x's dtype.
//
// At decode a linear reads its whole weight to multiply a row or a few, so its time is the time to
// stream the weight from memory. The packed layout makes that one sequential read: each pair of K
// values of 64 output rows is one 256-byte run, multiplied by each input row's broadcast pair with
// AVX-512 BF16 dot products (vdpbf16ps) into fp32 accumulators, with no horizontal sums. With more rows
// (batched decode, prefill) a 64-row block of the weight stays in cache while every group of 6 input
// rows multiplies it (6 x 4 accumulators and a K pair's 4 weight vectors fill the 32 zmm registers;
// ~5 % faster than groups of 4 at prefill: fewer loads per dot product; each row's sum runs along K in
// the same order either way). Work items (a weight block x a chunk of input rows, or up to 128 rows a
// block x a group of 6, so a weight of few blocks still splits evenly; in the fp32 form a block's panel
// where the rows are many) are claimed in runs by torch's intra-op threads as they go (parallel_items.h),
// each pulling the block it multiplies next into L2 while it multiplies this one. fp32 accumulation along K, as
// oneDNN's bf16 kernels: results agree with F.linear before the final bf16 rounding up to fp32 summation
// order.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "linear_bf16.h"
#include "linear_amx.h"
#include "parallel_items.h"
#include "tiered.h"

namespace folovllm::cpu {
namespace {

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "bf16 linear: weight must be a 2-D bfloat16 tensor");
  TORCH_CHECK(w.size(0) % kBlockRows == 0 && w.size(1) % 2 == 0,
              "bf16 linear: weight rows must be a multiple of ", kBlockRows, " and columns even; got ", w.sizes());
}

}  // namespace

at::Tensor linear_pack(const at::Tensor& weight) {
  check_weight(weight);
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), pairs = K / 2;
  at::Tensor out = at::empty({N / kBlockRows, pairs, kBlockRows, 2}, w.options());
  const uint32_t* src = reinterpret_cast<const uint32_t*>(w.data_ptr<c10::BFloat16>());  // a K pair = 32 bits
  uint32_t* dst = reinterpret_cast<uint32_t*>(out.data_ptr<c10::BFloat16>());
  for (int64_t b = 0; b < N / kBlockRows; ++b)
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t r = 0; r < kBlockRows; ++r)
        dst[(b * pairs + p) * kBlockRows + r] = src[(b * kBlockRows + r) * pairs + p];
  return out;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "the linear kernel needs the avx2 tier at least; this one is ",
              tier_name(tier()));
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kBlockRows && packed.size(3) == 2 &&
              packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(), "bf16 linear: weight is not packed");
  const int64_t N = packed.size(0) * kBlockRows, pairs = packed.size(1), K = pairs * 2;
  TORCH_CHECK((x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) && x.size(-1) == K,
              "bf16 linear: x must be bfloat16 or float32 [..., ", K, "]");
  const at::Tensor xc = x.reshape({-1, K}).contiguous();
  const int64_t M = xc.size(0);
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) bias_f = bias->to(at::kFloat).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty(out_shape, x.options());
  const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kBFloat16 && tier_at_least(Tier::kAvx512Bf16)) {
    const uint32_t* xp = reinterpret_cast<const uint32_t*>(xc.data_ptr<c10::BFloat16>());
    const __m512bh* wp = reinterpret_cast<const __m512bh*>(packed.data_ptr<c10::BFloat16>());
    c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
    if (amx_takes(M, K)) {  // an AMX host: the tile unit's form (linear_amx.h)
      at::Tensor tail;  // the last rows of x, zeros below them: a whole unit for the tile loads
      if (amx_needs_tail(M)) {
        const int64_t tail_rows = M % kAmxUnitRows;
        tail = at::zeros({kAmxUnitRows, K}, xc.options());
        tail.narrow(0, 0, tail_rows).copy_(xc.narrow(0, M - tail_rows, tail_rows));
      }
      const uint16_t* xa = reinterpret_cast<const uint16_t*>(xp);
      const uint16_t* ta = tail.defined() ? reinterpret_cast<const uint16_t*>(tail.const_data_ptr()) : nullptr;
      const char* wa = reinterpret_cast<const char*>(wp);
      parallel_runs(amx_item_count(M, N),
                    [&](int64_t i0, int64_t i1) { amx_linear_items(xa, ta, M, K, wa, bp, yp, N, i0, i1); });
      return y;
    }
    // grain 1: even a 576-row weight (9 blocks) is worth splitting over two threads at M = 1
    if (M <= kChunkRows) {
      parallel_runs(packed.size(0) * group_count(M),
                    [&](int64_t i0, int64_t i1) { linear_group_items(xp, M, pairs, wp, bp, yp, N, i0, i1); });
    } else {
      const int64_t items = packed.size(0) * ((M + kChunkRows - 1) / kChunkRows);  // blocks x chunks
      parallel_runs(items, [&](int64_t i0, int64_t i1) { linear_items(xp, M, pairs, wp, bp, yp, N, i0, i1); });
    }
    return y;
  }
  const bool f32 = xc.scalar_type() == at::kFloat;
  const LinearOut out{f32 ? y.data_ptr<float>() : nullptr,
                      f32 ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr()), N};
  const LinearIn xp{f32 ? xc.const_data_ptr<float>() : nullptr,
                    f32 ? nullptr : reinterpret_cast<const uint16_t*>(xc.const_data_ptr())};
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(packed.const_data_ptr());
  const bool wide = tier_at_least(Tier::kAvx512);
  const int64_t fp32_items = wide ? avx512::linear_item_count(M, N) : avx2::linear_item_count(M, N);
  parallel_items(fp32_items, [&](ItemClaims& claims) {
    if (wide) {
      avx512::linear_items(xp, M, K, wp, bp, out, claims);
    } else {
      avx2::linear_items(xp, M, K, wp, bp, out, claims);
    }
  });
  return y;
}

}  // namespace folovllm::cpu
