// GGUF-typed weights in their own packed layout (gguf_layout.h), registered as torch.ops.folovllm.*:
//   gguf_gemm  y = x W^T, W's outputs in parts (a merged q/k/v or gate/up linear), each part in one of
//              Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K with the file's own scales: one call for the layer
//   gguf_gemm_a8 gguf_gemm with its Q4_K and Q6_K parts' bf16 rows rounded to int8 (from a8_rows rows on)
//              for AVX512_VNNI byte dot products (quant_gguf_a8.h); elsewhere gguf_gemm's bits
//   gguf_argmax each row's first largest output of gguf_gemm, or of gguf_gemm_a8 from a8_rows rows on (the LM
//              head's greedy token, the logits never written for bf16 rows)
//   gguf_rows  rows of a one-part weight dequantized, each value the gguf package's to the last bit: the
//              lookup of an embedding table held packed (a tied head's, or a table alone)
//
// bf16 or fp32 activations, x's dtype out. At the avx512_bf16 tier the codes become bf16 in registers and
// meet the activations in bf16 dot products (quant_gguf.h; fp32 x as three bf16 parts, exact products);
// at avx2 and avx512 the fp32 form of tiered/gguf.cpp. Threads split the column blocks of every part in
// pairs, so a small part (a v projection) and a large one share the same call.
#include "ops.h"
#include "quant_gguf_a8.h"
#include "tiered.h"

#include <ATen/Dispatch.h>
#include <c10/util/Half.h>


namespace folovllm::cpu {
namespace {

// Sums of each fp32 row over each 16 inputs (the fp32 form's offsets), [M, K / 16].
void row_sums16(const float* x, int64_t M, int64_t K, float* out) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K / 16; ++g) {
      float sum = 0.f;
      for (int64_t k = 16 * g; k < 16 * (g + 1); ++k) sum += x[m * K + k];
      out[m * (K / 16) + g] = sum;
    }
}

// Each call's activation sums, in a buffer of the calling thread grown once (not one allocation per step).
float* sums_buffer(int64_t size) {
  thread_local std::vector<float> sums;
  if (static_cast<int64_t>(sums.size()) < size) sums.resize(size);
  return sums.data();
}

// a8: Q4_K and Q6_K parts from the rows rounded to int8 (gguf_gemm_a8, where gguf_a8_takes them).
void run_gguf_bf16(const GgufWeight& w, const at::Tensor& xb, at::Tensor& y, bool a8 = false) {
  const int64_t M = xb.size(0), K = w.K, N = w.N;
  const auto* x = xb.const_data_ptr<c10::BFloat16>();
  float* sums = sums_buffer(M * (K / 16));
  group_sums(x, M, K, 16, sums);
  thread_local A8Buffers buffers;
  const GgufA8Rows xa = a8 ? gguf_a8_quantize(x, M, K, buffers) : GgufA8Rows{};
  const GgufA8Rows* rows = a8 ? &xa : nullptr;
  parallel_tasks(w.tasks(), M, [&](int64_t t0, int64_t t1) {
    gguf_ranges(w, t0, t1, [&](const GgufPartView& part, int64_t b0, int64_t b1) {
      if (y.scalar_type() == at::kFloat)
        gguf_blocks_a8(part, b0, b1, x, rows, M, K, sums, y.mutable_data_ptr<float>(), N);
      else
        gguf_blocks_a8(part, b0, b1, x, rows, M, K, sums, y.mutable_data_ptr<c10::BFloat16>(), N);
    });
  });
}

// Below avx512_bf16 (tiered/gguf.cpp): x rows [M, K] (bf16 or fp32) -> y [M, N].
void run_gguf_fp32(const GgufWeight& w, const at::Tensor& x, at::Tensor& y) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t M = xf.size(0), K = w.K;
  const float* xp = xf.const_data_ptr<float>();
  float* sums = sums_buffer(M * (K / 16));
  row_sums16(xp, M, K, sums);
  const LinearOut out{y.scalar_type() == at::kFloat ? y.data_ptr<float>() : nullptr,
                      y.scalar_type() == at::kFloat ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr()), w.N};
  const bool wide = tier_at_least(Tier::kAvx512);
  parallel_tasks(w.tasks(), M, [&](int64_t t0, int64_t t1) {
    gguf_ranges(w, t0, t1, [&](const GgufPartView& part, int64_t b0, int64_t b1) {
      (wide ? &avx512::gguf_blocks : &avx2::gguf_blocks)(part.type, xp, M, K, sums, part.data, part.block_bytes,
                                                         part.meta_area, out, part.col0, b0, b1);
    });
  });
}

// bf16 rows [M, K] -> ids [M]: each row's argmax of run_gguf_bf16's bf16 y (a8: its Q4_K and Q6_K parts from
// the rows rounded to int8), without y. Each work item keeps its own rows' best (slot p0: its first task), then
// the items are reduced in column order (the first maximum wins).
void run_gguf_argmax(const GgufWeight& w, const at::Tensor& xb, at::Tensor& ids, bool a8) {
  const int64_t M = xb.size(0), K = w.K, tasks = w.tasks();
  const auto* x = xb.const_data_ptr<c10::BFloat16>();
  float* sums = sums_buffer(M * (K / 16));
  group_sums(x, M, K, 16, sums);
  thread_local A8Buffers buffers;
  const GgufA8Rows xa = a8 ? gguf_a8_quantize(x, M, K, buffers) : GgufA8Rows{};
  const GgufA8Rows* rounded = a8 ? &xa : nullptr;
  ItemArgmax items(tasks, M);
  parallel_tasks(tasks, M, [&](int64_t t0, int64_t t1) {
    const ArgmaxRows rows = items.rows(t0);
    gguf_ranges(w, t0, t1, [&](const GgufPartView& part, int64_t b0, int64_t b1) {
      gguf_blocks_a8(part, b0, b1, x, rounded, M, K, sums, rows, w.N);
    });
  });
  items.reduce(ids.mutable_data_ptr<int64_t>());
}

float half_at(const uint8_t* p) {
  c10::Half h;
  std::memcpy(&h, p, sizeof(h));
  return static_cast<float>(h);
}

// Output `lane` of column block `block` (gguf_layout.h), all K inputs, as the gguf package dequantizes them:
// each group's scale d sc (and min dmin m) in fp32, then w = s q - min (Q4_0: d (q - 8); Q4_1: d q + m;
// Q8_0: q d; Q6_K: s (q - 32)).
void dequantize_row(const GgufPartView& part, int64_t K, int64_t block, int lane, float* out) {
  const uint8_t* meta = part.data + block * part.block_bytes;
  const uint8_t* codes = meta + part.meta_area;
  const GgufLayout& l = part.layout;
  const auto type = static_cast<GgufType>(part.type);
  for (int64_t g = 0; g < K / l.group_k; ++g) {
    const uint8_t* group = codes + g * l.group_code_bytes;
    float scale = 0.f, min = 0.f;
    int offset = 0;  // subtracted from the code before the scale
    switch (type) {
      case GgufType::kQ4_0: scale = half_at(meta + 32 * g + 2 * lane); offset = 8; break;
      case GgufType::kQ4_1: scale = half_at(meta + 64 * g + 2 * lane); min = -half_at(meta + 64 * g + 32 + 2 * lane); break;
      case GgufType::kQ8_0: scale = half_at(meta + 32 * g + 2 * lane); break;
      case GgufType::kQ6_K: {
        const uint8_t* sb = meta + 288 * (g >> 4);
        scale = half_at(sb + 2 * lane) * static_cast<float>(static_cast<int8_t>(sb[32 + 16 * (g & 15) + lane]));
        offset = 32;
        break;
      }
      case GgufType::kQ4_K:
      case GgufType::kQ5_K: {
        const uint8_t* sb = meta + 320 * (g >> 3);
        scale = half_at(sb + 2 * lane) * static_cast<float>(sb[64 + 16 * (g & 7) + lane]);
        min = half_at(sb + 32 + 2 * lane) * static_cast<float>(sb[192 + 16 * (g & 7) + lane]);
        break;
      }
    }
    for (int64_t i = 0; i < l.group_k; ++i) {
      int q;
      if (type == GgufType::kQ8_0) {
        q = static_cast<int8_t>(group[32 * (i / 2) + 2 * lane + i % 2]);
      } else {
        const int chunk = static_cast<int>(i / 8), p = static_cast<int>(i % 8) / 2, odd = static_cast<int>(i % 2);
        uint32_t word, high = 0;
        std::memcpy(&word, group + 64 * chunk + 4 * lane, 4);
        q = static_cast<int>((word >> (4 * p + 16 * odd)) & 15);
        if (type == GgufType::kQ5_K) {
          std::memcpy(&high, group + 256 + 4 * lane, 4);
          q |= static_cast<int>((high >> (4 * chunk + p + 16 * odd)) & 1) << 4;
        } else if (type == GgufType::kQ6_K) {
          std::memcpy(&high, group + 128 + 4 * lane, 4);
          q |= static_cast<int>((high >> (2 * (4 * chunk + p) + 16 * odd)) & 3) << 4;
        }
      }
      out[g * l.group_k + i] = scale * static_cast<float>(q - offset) - min;
    }
  }
}

// x [..., K] (checked against w) -> [..., N]; int8 activations from a8_rows rows on as gguf_gemm_a8 (0: never).
at::Tensor run_gguf_gemm(const at::Tensor& x, const GgufWeight& w, int64_t a8_rows) {
  TORCH_CHECK(x.size(-1) == w.K, "x's last dim (", x.size(-1), ") does not match the weight's inputs (", w.K, ")");
  const int64_t M = x.dim() == 0 ? 0 : x.numel() / std::max<int64_t>(w.K, 1);
  if (a8_rows > 0 && x.scalar_type() == at::kBFloat16 && gguf_a8_takes(w, M, a8_rows))
    return rows_gemm(x, w.N, [&](const at::Tensor& xb, at::Tensor& y) { run_gguf_bf16(w, xb, y, true); });
  if (!cpu_supported()) {
    return rows_gemm(x, w.N, [&](const at::Tensor& rows, at::Tensor& y) { run_gguf_fp32(w, rows, y); });
  }
  return bf16_rows_gemm(x, w.N, [&](const at::Tensor& xb, at::Tensor& y) { run_gguf_bf16(w, xb, y); });
}

}  // namespace

// x [..., K] -> [..., N]
at::Tensor gguf_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts) {
  check_activations(x, weight, "gguf_gemm", Tier::kAvx2);
  return run_gguf_gemm(x, gguf_weight(weight, parts), 0);
}

// x [..., K] -> [..., N]: gguf_gemm, its Q4_K and Q6_K parts multiplied with int8 activations where
// gguf_a8_takes the rows (bf16 x of at least a8_rows rows on a VNNI CPU; else gguf_gemm's path).
at::Tensor gguf_gemm_a8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts, int64_t a8_rows) {
  check_activations(x, weight, "gguf_gemm_a8", Tier::kAvx2);
  TORCH_CHECK(a8_rows >= 1, "gguf_gemm_a8: a8_rows must be at least 1, got ", a8_rows);
  return run_gguf_gemm(x, gguf_weight(weight, parts), a8_rows);
}

// x [M, K] -> [M] int64: each row's argmax of gguf_gemm(x), or of gguf_gemm_a8(x, ..., a8_rows) where a8_rows
// is positive (torch's argmax: the first of equal values), the LM head's greedy token. bf16 x at the
// avx512_bf16 tier: kept inside the matmul's loop, the logits never written; else gguf_gemm's logits, then
// torch's argmax.
at::Tensor gguf_argmax(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts, int64_t a8_rows) {
  TORCH_CHECK(x.dim() == 2, "gguf_argmax takes x [rows, K]");
  TORCH_CHECK(a8_rows >= 0, "gguf_argmax: a8_rows must be 0 (never) or positive, got ", a8_rows);
  if (x.size(0) == 0) return at::empty({0}, x.options().dtype(at::kLong));
  if (x.scalar_type() != at::kBFloat16 || !cpu_supported())
    return gguf_gemm(x, weight, parts).to(at::kFloat).argmax(-1);  // torch reduces fp32 faster than bf16
  check_activations(x, weight, "gguf_argmax", Tier::kAvx2);
  const GgufWeight w = gguf_weight(weight, parts);
  TORCH_CHECK(x.size(-1) == w.K, "x's last dim (", x.size(-1), ") does not match the weight's inputs (", w.K, ")");
  at::Tensor ids = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  run_gguf_argmax(w, x.contiguous(), ids, a8_rows > 0 && gguf_a8_takes(w, x.size(0), a8_rows));
  return ids;
}

// ids [...] -> [..., K] in dtype: rows of a one-part gguf_gemm weight.
at::Tensor gguf_rows(const at::Tensor& weight, const at::Tensor& parts, const at::Tensor& ids, at::ScalarType dtype) {
  const GgufWeight w = gguf_weight(weight, parts);
  TORCH_CHECK(w.parts.size() == 1, "gguf_rows reads a one-part weight (a table); this one has ", w.parts.size());
  TORCH_CHECK(ids.scalar_type() == at::kLong, "ids must be int64");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "gguf_rows returns float32, bfloat16 or float16");
  const at::Tensor flat = ids.reshape({-1}).contiguous();
  const int64_t K = w.K, count = flat.numel();
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(K);
  at::Tensor out = at::empty({count, K}, weight.options().dtype(dtype));
  const int64_t* rows = flat.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    TORCH_CHECK(rows[i] >= 0 && rows[i] < w.N, "gguf_rows: id ", rows[i], " out of range [0, ", w.N, ")");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "gguf_rows", [&] {
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, count, 16, [&](int64_t i0, int64_t i1) {
      std::vector<float> row(K);
      for (int64_t i = i0; i < i1; ++i) {
        dequantize_row(w.parts[0], K, rows[i] / kGgufBlockCols, static_cast<int>(rows[i] % kGgufBlockCols),
                       row.data());
        for (int64_t k = 0; k < K; ++k) dst[i * K + k] = static_cast<scalar_t>(row[k]);
      }
    });
  });
  return out.view(shape);
}

}  // namespace folovllm::cpu
