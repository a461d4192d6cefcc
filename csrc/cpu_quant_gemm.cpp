// Weight-only quantized matmuls for CPU (AVX512_BF16), registered as torch.ops.folovllm_cpu_quant.*:
//   int4_gemm   y = x W^T, W 4-bit with a scale and zero per group of inputs  (cpu_quant_int4.h)
//   int8_gemm   y = x W^T, W int8 with one scale per output                  (cpu_quant_int8.h)
//   supported   whether this CPU runs them (AVX512F/BW/VL/DQ and AVX512_BF16)
//
// Both take bf16 or fp32 activations and return x's dtype; weights are repacked once at load
// (folovllm/model/quant/cpu_quant.py). The codes become bf16 in registers (or, for int8 with many rows,
// in a small tile) and meet the activations in AVX512_BF16 dot products with fp32 sums.

#include "cpu_quant_int4.h"
#include "cpu_quant_int8.h"

#include <torch/library.h>

namespace {

// x [..., K] -> [..., N]
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                     int64_t group_size) {
  check_activations(x, codes, "int4_gemm");
  check_int4_packed(codes, scales, zeros, x.size(-1), group_size);
  return bf16_rows_gemm(x, codes.size(0) * kBlockCols, [&](const at::Tensor& xb, at::Tensor& y) {
    run_int4(xb, codes, scales, zeros, group_size, y);
  });
}

at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_activations(x, codes, "int8_gemm");
  check_int8_packed(codes, scales, x.size(-1));
  return bf16_rows_gemm(x, codes.size(0) * kBlockCols,
                        [&](const at::Tensor& xb, at::Tensor& y) { run_int8(xb, codes, scales, y); });
}

bool supported() { return cpu_supported(); }

}  // namespace

TORCH_LIBRARY(folovllm_cpu_quant, m) {
  m.def("int4_gemm(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int group_size) -> Tensor");
  m.def("int8_gemm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("supported() -> bool", &supported);
}

TORCH_LIBRARY_IMPL(folovllm_cpu_quant, CPU, m) {
  m.impl("int4_gemm", &int4_gemm);
  m.impl("int8_gemm", &int8_gemm);
}
