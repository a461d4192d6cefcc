// Weight-only quantized matmuls for CPU, registered as torch.ops.folovllm.*:
//   int4_gemm   y = x W^T, W 4-bit with a scale and zero per group of inputs  (quant_int4.h)
//   int4_gemm_perm  int4_gemm of x's columns permuted first (act-order: the weight's rows were permuted at load)
//   int4_gemm_a8  int4_gemm with the activations rounded to int8 per row and group, on AVX512_VNNI
//                 byte dot products (quant_int4_a8.h), or AVX2's two-instruction ones (tiered/int4_a8.cpp)
//   int4_mlp    down(silu(gate) * up) for a merged int4 gate_up projection and an int4 down projection:
//               one call for the three (the SiLU-mul is fused_ops.cpp's)
//   int8_gemm   y = x W^T, W int8 with one scale per output                  (quant_int8.h)
//   int8_rows   rows of an int8_gemm weight, dequantized (q * scale): the embedding lookup of a tied int8 head
//   int8_argmax each row's first largest entry of int8_gemm's y: the int8 LM head's greedy token (bf16 x:
//               in the matmul's own loop, y never written)
//
// Both take bf16 or fp32 activations and return x's dtype; weights are repacked once at load
// (folovllm/model/quantization/cpu_int4.py). At the avx512_bf16 tier the codes become bf16 in registers (or,
// for int8 with many rows, in a small tile) and meet the activations in AVX512_BF16 dot products with fp32
// sums; below it the int4 and int8 matmuls run in fp32 FMAs (tiered/int4.cpp, tiered/int8.cpp).

#include "ops.h"
#include "quant_int4.h"
#include "quant_int4_a8.h"
#include "quant_int8.h"
#include "tiered.h"

#include <ATen/Dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace folovllm::cpu {

namespace {

// Below avx512_bf16: the per-tier fp32 form (tiered/int4.cpp). x rows [M, K] (bf16 or fp32) -> y [M, N].
void run_int4_fp32(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                   int64_t group_size, at::Tensor& y) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t M = xf.size(0), K = xf.size(1), N = y.size(1), groups = num_groups(K, group_size);
  const float* xp = xf.const_data_ptr<float>();
  std::vector<float> xsum(M * groups, 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xsum[m * groups + k / group_size] += xp[m * K + k];
  const LinearOut out{y.scalar_type() == at::kFloat ? y.data_ptr<float>() : nullptr,
                      y.scalar_type() == at::kFloat ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr()), N};
  const auto* cp = reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>());
  const bool bf16_scales = scales.scalar_type() == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
  const int64_t blocks = N / kBlockCols;
  parallel_tasks((blocks + kColBlocks - 1) / kColBlocks, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kColBlocks, b1 = std::min(blocks, p1 * kColBlocks);
    if (wide) {
      avx512::int4_blocks(xp, M, K, xsum.data(), groups, cp, scales.const_data_ptr(), zeros.const_data_ptr(),
                          bf16_scales, group_size, out, b0, b1);
    } else {
      avx2::int4_blocks(xp, M, K, xsum.data(), groups, cp, scales.const_data_ptr(), zeros.const_data_ptr(),
                        bf16_scales, group_size, out, b0, b1);
    }
  });
}

// int8 below avx512_bf16: x rows [M, K] -> y [M, N] (tiered/int8.cpp).
void run_int8_fp32(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, at::Tensor& y) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t M = xf.size(0), K = xf.size(1), N = y.size(1), blocks = N / kBlockCols;
  const LinearOut out{y.scalar_type() == at::kFloat ? y.data_ptr<float>() : nullptr,
                      y.scalar_type() == at::kFloat ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr()), N};
  const bool bf16_scales = scales.scalar_type() == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
  parallel_tasks((blocks + kInt8Cols - 1) / kInt8Cols, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kInt8Cols, b1 = std::min(blocks, p1 * kInt8Cols);
    if (wide) {
      avx512::int8_blocks(xf.const_data_ptr<float>(), M, K, codes.const_data_ptr<int8_t>(), scales.const_data_ptr(),
                          bf16_scales, out, b0, b1);
    } else {
      avx2::int8_blocks(xf.const_data_ptr<float>(), M, K, codes.const_data_ptr<int8_t>(), scales.const_data_ptr(),
                        bf16_scales, out, b0, b1);
    }
  });
}

// int8_argmax below avx512_bf16 (bf16 x: logits rounded to bf16 first). Each work item keeps its own rows'
// best, then the items are reduced in column order (the first maximum wins).
void run_int8_argmax_fp32(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, at::Tensor& ids) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), blocks = codes.size(0);
  const int64_t tasks = (blocks + kInt8Cols - 1) / kInt8Cols;
  ItemArgmax items(tasks, M);
  const bool bf16_scales = scales.scalar_type() == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
  parallel_tasks(tasks, M, [&](int64_t p0, int64_t p1) {
    const ArgmaxRows rows = items.rows(p0);
    const int64_t b0 = p0 * kInt8Cols, b1 = std::min(blocks, p1 * kInt8Cols);
    auto* run = wide ? &avx512::int8_argmax_blocks : &avx2::int8_argmax_blocks;
    run(xf.const_data_ptr<float>(), M, K, codes.const_data_ptr<int8_t>(), scales.const_data_ptr(), bf16_scales,
        true, rows.best, rows.id, b0, b1);
  });
  items.reduce(ids.mutable_data_ptr<int64_t>());
}

}  // namespace

// x [..., K] -> [..., N]
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                     int64_t group_size) {
  check_activations(x, codes, "int4_gemm", Tier::kAvx2);
  check_int4_packed(codes, scales, zeros, x.size(-1), group_size);
  if (!cpu_supported()) {
    return rows_gemm(x, codes.size(0) * kBlockCols, [&](const at::Tensor& rows, at::Tensor& y) {
      run_int4_fp32(rows, codes, scales, zeros, group_size, y);
    });
  }
  return bf16_rows_gemm(x, codes.size(0) * kBlockCols, [&](const at::Tensor& xb, at::Tensor& y) {
    run_int4(xb, codes, scales, zeros, group_size, y);
  });
}

// x [..., K] -> [..., N]: int4_gemm(x.index_select(-1, perm)), one op where Python made two calls. The
// gather is a loop per row (gather_row for bf16): torch's index_select along the last dimension took
// 1-3 ns an element, ~100-270 us of a 64-row call.
at::Tensor int4_gemm_perm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                          const at::Tensor& zeros, int64_t group_size, const at::Tensor& perm) {
  check_activations(x, codes, "int4_gemm_perm", Tier::kAvx2);
  const int64_t K = x.size(-1);
  check_permutation(perm, K);
  const int64_t* order = perm.const_data_ptr<int64_t>();
  const at::Tensor xc = x.reshape({-1, K}).contiguous();
  at::Tensor gathered = at::empty(xc.sizes(), xc.options());
  const bool bf16 = xc.scalar_type() == at::kBFloat16;
  at::parallel_for(0, xc.size(0), std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (bf16 && cpu_supported()) {
        gather_row(xc.const_data_ptr<c10::BFloat16>() + m * K, order, K,
                   gathered.mutable_data_ptr<c10::BFloat16>() + m * K);
      } else if (bf16) {
        const c10::BFloat16* row = xc.const_data_ptr<c10::BFloat16>() + m * K;
        c10::BFloat16* out = gathered.mutable_data_ptr<c10::BFloat16>() + m * K;
        for (int64_t k = 0; k < K; ++k) out[k] = row[order[k]];
      } else {
        const float* row = xc.const_data_ptr<float>() + m * K;
        float* out = gathered.mutable_data_ptr<float>() + m * K;
        for (int64_t k = 0; k < K; ++k) out[k] = row[order[k]];
      }
    }
  });
  return int4_gemm(gathered.view(x.sizes()), codes, scales, zeros, group_size);
}

namespace {

// W4A8 without VNNI (tiered/int4_a8.cpp): the same rounding and sums as run_int4_a8, bit for bit.
void run_int4_a8_tiered(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                        int64_t group_size, at::Tensor& y) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t M = xf.size(0), K = xf.size(1), N = y.size(1), groups = num_groups(K, group_size);
  std::vector<int8_t> a(M * K);
  std::vector<float> scale(M * groups), sum(M * groups);
  const bool wide = tier_at_least(Tier::kAvx512), bf16_scales = scales.scalar_type() == at::kBFloat16;
  (wide ? &avx512::int4_a8_quantize : &avx2::int4_a8_quantize)(xf.const_data_ptr<float>(), M, K, group_size,
                                                                 a.data(), scale.data(), sum.data());
  const LinearOut out{y.scalar_type() == at::kFloat ? y.data_ptr<float>() : nullptr,
                      y.scalar_type() == at::kFloat ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr()), N};
  const auto* cp = reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>());
  const int64_t blocks = N / kBlockCols;
  parallel_tasks((blocks + kColBlocks - 1) / kColBlocks, M, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kColBlocks, b1 = std::min(blocks, p1 * kColBlocks);
    (wide ? &avx512::int4_a8_blocks : &avx2::int4_a8_blocks)(a.data(), M, K, scale.data(), sum.data(), groups, cp,
                                                             scales.const_data_ptr(), zeros.const_data_ptr(),
                                                             bf16_scales, group_size, out, b0, b1);
  });
}

}  // namespace

// x [..., K] -> [..., N], activations rounded to int8
at::Tensor int4_gemm_a8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& zeros, int64_t group_size) {
  check_activations(x, codes, "int4_gemm_a8", Tier::kAvx2);
  check_int4_packed(codes, scales, zeros, x.size(-1), group_size);
  // fp32 x is rounded to int8 as it is, not split into bf16 parts
  return rows_gemm(x, codes.size(0) * kBlockCols, [&](const at::Tensor& xb, at::Tensor& y) {
    if (cpu_vnni_supported()) {
      run_int4_a8(xb, codes, scales, zeros, group_size, y);
    } else {
      run_int4_a8_tiered(xb, codes, scales, zeros, group_size, y);
    }
  });
}

// x [..., H] -> [..., H]: down(silu_and_mul(gate_up(x))), each int4 matmul with int8 activations when x has
// at least a8_rows rows (int4_gemm_a8), else bf16 ones.
// At one token the MLP's three ops are each a few microseconds of Python and dispatch around ~20-40 us of
// work; this is one. The SiLU-mul is fused_ops.cpp's silu_and_mul, so the
// result is the three ops' bit for bit.
at::Tensor int4_mlp(const at::Tensor& x, const at::Tensor& gate_up_codes, const at::Tensor& gate_up_scales,
                    const at::Tensor& gate_up_zeros, int64_t gate_up_group, const at::Tensor& down_codes,
                    const at::Tensor& down_scales, const at::Tensor& down_zeros, int64_t down_group, int64_t a8_rows) {
  const int64_t rows = x.dim() == 0 ? 0 : x.numel() / std::max<int64_t>(x.size(-1), 1);
  auto gemm = rows >= a8_rows ? &int4_gemm_a8 : &int4_gemm;
  const at::Tensor gate_up = gemm(x, gate_up_codes, gate_up_scales, gate_up_zeros, gate_up_group);
  return gemm(silu_and_mul(gate_up), down_codes, down_scales, down_zeros, down_group);
}

at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_activations(x, codes, "int8_gemm", Tier::kAvx2);
  check_int8_packed(codes, scales, x.size(-1));
  if (!cpu_supported()) {
    return rows_gemm(x, codes.size(0) * kBlockCols,
                     [&](const at::Tensor& rows, at::Tensor& y) { run_int8_fp32(rows, codes, scales, y); });
  }
  return bf16_rows_gemm(x, codes.size(0) * kBlockCols,
                        [&](const at::Tensor& xb, at::Tensor& y) { run_int8(xb, codes, scales, y); });
}

// x [M, K] -> [M] int64: each row's argmax of int8_gemm(x) (torch's argmax: the first of equal values),
// without handing the logits back to Python for the sampler. fused (bf16 x only): the kernel keeps each
// row's best as it goes (ArgmaxRows), the logits never written; else int8_gemm's logits, then torch's argmax.
at::Tensor int8_argmax(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, bool fused) {
  TORCH_CHECK(x.dim() == 2, "int8_argmax takes x [rows, K]");
  if (x.size(0) == 0) return at::empty({0}, x.options().dtype(at::kLong));
  if (!fused || x.scalar_type() != at::kBFloat16)
    return int8_gemm(x, codes, scales).to(at::kFloat).argmax(-1);  // torch reduces fp32 faster than bf16
  check_activations(x, codes, "int8_argmax", Tier::kAvx2);
  check_int8_packed(codes, scales, x.size(-1));
  const at::Tensor xb = x.contiguous();
  at::Tensor ids = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  if (cpu_supported()) {
    run_int8_argmax(xb, codes, scales, ids);
  } else {
    run_int8_argmax_fp32(xb, codes, scales, ids);
  }
  return ids;
}

// ids [...] -> [..., K] in dtype: row id of the packed int8 weight [N / 16, K / 2, 16, 2] times its scale,
// each value float(q) * float(scale) rounded once to dtype (what the codes' gather, two casts, a multiply
// and a cast in torch give; one op where those were about ten).
at::Tensor dequantized_int8_rows(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& ids,
                                 at::ScalarType dtype) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 4 && codes.size(2) == kBlockCols &&
                  codes.size(3) == 2 && codes.is_contiguous(), "codes must be int8 [N / 16, K / 2, 16, 2], contiguous");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == codes.size(0) * kBlockCols, "scales must be [N]");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "ids must be int64");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "int8_rows returns float32, bfloat16 or float16");
  const int64_t N = scales.size(0), pairs = codes.size(1), K = 2 * pairs;
  const at::Tensor flat = ids.reshape({-1}).contiguous();
  TORCH_CHECK(scales.is_contiguous() && (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kBFloat16 ||
                                         scales.scalar_type() == at::kHalf), "scales must be float32, bfloat16 or float16");
  auto scale_of = [&](int64_t r) -> float {  // one row's scale as float (exact from any of the three)
    if (scales.scalar_type() == at::kBFloat16) return static_cast<float>(scales.const_data_ptr<c10::BFloat16>()[r]);
    if (scales.scalar_type() == at::kHalf) return static_cast<float>(scales.const_data_ptr<c10::Half>()[r]);
    return scales.const_data_ptr<float>()[r];
  };
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(K);
  at::Tensor out = at::empty({flat.numel(), K}, codes.options().dtype(dtype));
  const int64_t* rows = flat.const_data_ptr<int64_t>();
  const int8_t* q = codes.const_data_ptr<int8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "int8_rows", [&] {
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const int64_t r = rows[i];
      TORCH_CHECK(r >= 0 && r < N, "int8_rows: id ", r, " out of range [0, ", N, ")");
      const int8_t* block = q + (r / kBlockCols) * pairs * kBlockCols * 2 + (r % kBlockCols) * 2;
      const float s = scale_of(r);
      for (int64_t p = 0; p < pairs; ++p)
        for (int j = 0; j < 2; ++j)
          dst[i * K + 2 * p + j] = static_cast<scalar_t>(static_cast<float>(block[p * kBlockCols * 2 + j]) * s);
    }
  });
  return out.view(shape);
}

}  // namespace folovllm::cpu
