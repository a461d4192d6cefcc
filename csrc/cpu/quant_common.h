// What the quantized matmuls (quant_int4.h, quant_int8.h) share: the tier check, fp32 <-> bf16 vector loads
// and stores, and the wrapper that runs fp32 activations as bf16 rows.
#pragma once

#include "isa.h"
#include "parallel_items.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace folovllm::cpu {
namespace {

constexpr int64_t kBlockCols = 16;  // output columns per vector

// The quantized matmuls' bf16 dot-product forms (and the team that runs them) need the AVX-512 BF16 tier;
// the int4 matmul has an fp32 form below it (tiered/int4.cpp).
bool cpu_supported() { return tier_at_least(Tier::kAvx512Bf16); }

// Rows rounded to int8 for byte dot products (quant_gguf_a8.h): the codes, and per row each block's scale and
// sum; buffers a thread keeps, grown once.
struct A8Buffers {
  std::vector<int8_t> a;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};

// Weights stream from memory a few columns at a time, too few streams for the hardware prefetcher to
// keep enough reads in flight: each read asks for the line kPrefetchBytes further on as well, and for
// the one kPrefetchFarBytes on into L2, so that a DRAM read's latency is covered while the unpacking
// of the codes in between keeps the core busy.
constexpr int64_t kPrefetchBytes = 2048;  // 1-4 KiB measured alike (noisy), 8 KiB worse, none 30% slower
constexpr int64_t kPrefetchFarBytes = 16384;  // batch-1 int4: ~20% faster than none, 8 KiB between (32 KiB alike)
FOLO_INLINE void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchFarBytes, _MM_HINT_T1);
}
// The same, but no further than `end`: past a call's weights lie other tensors' bytes (or none), and a
// one-row call is short enough (173 KiB for 576 x 576 int4) that the 16 KiB per stream read in vain
// shows: one-row int4 calls 2-8 % faster with weights streamed (one thread, 11 alternating rounds).
// (Prefetching a call's first 16 KiB at entry as well measured no better.)
FOLO_INLINE void prefetch_ahead(const void* p, const void* end) {
  const char* near = static_cast<const char*>(p) + kPrefetchBytes;
  const char* far = static_cast<const char*>(p) + kPrefetchFarBytes;
  if (near < end) _mm_prefetch(near, _MM_HINT_T0);
  if (far < end) _mm_prefetch(far, _MM_HINT_T1);
}

// 16 fp32 values from fp32 or bf16 storage.
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
FOLO_TARGET_AVX512_BF16 FOLO_INLINE __m512 load16(const c10::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// 16 fp32 values to fp32 or bf16 (round to nearest even) storage.
FOLO_TARGET_AVX512_BF16 FOLO_INLINE void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
FOLO_TARGET_AVX512_BF16 FOLO_INLINE void store16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

void check_activations(const at::Tensor& x, const at::Tensor& codes, const char* op, Tier floor = Tier::kAvx512Bf16) {
  TORCH_CHECK(tier_at_least(floor), op, " needs the ", tier_name(floor), " tier; this one is ", tier_name(tier()));
  TORCH_CHECK(x.device().is_cpu() && codes.device().is_cpu(), op, " runs on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "x must be bfloat16 or float32");
  TORCH_CHECK(x.dim() >= 1, "x needs a last (input) dimension");
}

// x [..., K] -> [..., N] in x's dtype, where run(x2, y) fills y [rows, N] from x's rows x2 [rows, K] as they are.
template <typename Run>
at::Tensor rows_gemm(const at::Tensor& x, int64_t N, Run run) {
  if (x.dim() == 2 && x.is_contiguous() && x.size(0) > 0) {
    // the decode step's case, without the reshapes: at one row this call's own overhead is a good part of it
    at::Tensor y = at::empty({x.size(0), N}, x.options());
    run(x, y);
    return y;
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  const at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
  at::Tensor y = at::empty({x2.size(0), N}, x.options());
  if (x2.size(0) > 0) run(x2, y);
  return y.view(shape);
}

// x [..., K] (bf16 or fp32) -> [..., N] in x's dtype, where run(xb, y) fills y [rows, N] from bf16 rows xb.
// bf16 x runs as is (y bf16). fp32 x = hi + mid + lo exactly (three bf16 parts hold fp32's 24-bit
// significand): run as three times the rows into fp32, the three products summed.
template <typename Run>
at::Tensor bf16_rows_gemm(const at::Tensor& x, int64_t N, Run run) {
  if (x.scalar_type() == at::kBFloat16) return rows_gemm(x, N, run);
  const int64_t K = x.size(-1);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  if (M == 0) return at::empty(shape, x.options());
  constexpr int kParts = 3;
  at::Tensor split = at::empty({kParts * M, K}, x.options().dtype(at::kBFloat16));
  const float* src = x2.const_data_ptr<float>();
  auto* parts = split.mutable_data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < M * K; ++i) {
    float rest = src[i];
    for (int p = 0; p < kParts; ++p) {
      const c10::BFloat16 part(rest);
      parts[p * M * K + i] = part;
      rest -= static_cast<float>(part);
    }
  }
  at::Tensor products = at::empty({kParts * M, N}, x.options());
  run(split, products);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* b = products.const_data_ptr<float>();
  float* dst = y.mutable_data_ptr<float>();
  for (int64_t i = 0; i < M * N; ++i) dst[i] = b[i] + b[M * N + i] + b[2 * M * N + i];
  return y.view(shape);
}

// Splits [0, tasks) over torch's intra-op threads: claimed in runs as they go (parallel_items.h), or with the
// linear_claims switch off, a fixed share each, few rows split finer so both threads always have work.
template <typename Fn>
void parallel_tasks(int64_t tasks, int64_t rows, Fn fn) {
  parallel_runs(tasks, fn, std::max<int64_t>(1, std::min<int64_t>(8, 256 / std::max<int64_t>(rows, 1))));
}

}  // namespace
}  // namespace folovllm::cpu
