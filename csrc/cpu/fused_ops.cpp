// Fused element-wise ops of a decoder layer for CPU, registered as torch.ops.folovllm.*:
//   add_rms_norm      residual += x, then out = RMSNorm(residual) * weight  (one pass over the rows)
//   rms_norm          out = RMSNorm(x) * weight
//   rotary_store_kv   q/k (optional per-head RMSNorm first) rotated by cos/sin, k and v stored at their
//                     paged-cache slots (quantized for an int8/fp8 cache, kv_quant.h), in one call per layer
//   silu_and_mul      out = silu(gate) * up for a merged [gate | up] projection (csrc/cpu/tiered/activation.cpp)
//
// Each op rounds where the torch sequence it replaces rounds (a bf16 result after every torch op), so
// it reproduces that sequence: fp32 to the last bits (no FMA contraction: csrc/build.py compiles this
// file with -ffp-contract=off), bf16 up to the order of a norm's sum of squares and exp's last ulp.
// Rows run on torch's intra-op pool (at::parallel_for), inline when a step is small.
//
// Portable build: plain C++ the compiler auto-vectorizes, compiled for each x86-64 level (FOLO_PER_LEVEL)
// and run at the one the tier allows.

#include "kv_quant.h"
#include "ops.h"
#include "simd.h"
#include "tiered.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <vector>

namespace folovllm::cpu {
namespace {

constexpr int64_t kGrainElements = 16384;  // elements below which a parallel region costs more than it saves

template <typename T>
FOLO_INLINE T from_float(float x);
template <>
FOLO_INLINE float from_float<float>(float x) { return x; }
template <>
FOLO_INLINE c10::BFloat16 from_float<c10::BFloat16>(float x) {
  // round to nearest even, as torch's float -> bfloat16 cast (NaN kept quiet)
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  c10::BFloat16 out;
  out.x = std::isnan(x) ? uint16_t{0x7fc0} : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return out;
}

// The value after one torch op in dtype T: bf16 results are rounded, fp32 ones are already.
template <typename T>
FOLO_INLINE float round_to(float x) { return to_float(from_float<T>(x)); }

// 1 / sqrt(mean(x^2) + eps) over n floats, fp32 as torch's rms_norm.
FOLO_INLINE float inv_rms(const float* x, int64_t n, float eps) {
  return 1.f / std::sqrt(lane_dot(x, x, n) / static_cast<float>(n) + eps);
}

// out[d] = T(T(x[d] * inv) * w[d]): HF's order (normalize in fp32, cast back, then scale).
template <typename T>
FOLO_INLINE void scale_row(const float* x, float inv, const T* w, T* out, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = from_float<T>(round_to<T>(x[d] * inv) * to_float(w[d]));
}

template <typename T>
FOLO_INLINE void add_rms_norm_rows(T* residual, const T* x, const T* w, T* out, int64_t begin, int64_t end,
                                   int64_t n, float eps, bool add) {
  std::vector<float> row(n);
  for (int64_t r = begin; r < end; ++r) {
    T* res = residual + r * n;
    const T* src = add ? x + r * n : res;
    for (int64_t d = 0; d < n; ++d) {
      const float sum = add ? to_float(src[d]) + to_float(res[d]) : to_float(src[d]);
      if (add) res[d] = from_float<T>(sum);
      row[d] = round_to<T>(sum);
    }
    scale_row(row.data(), inv_rms(row.data(), n, eps), w, out + r * n, n);
  }
}

FOLO_PER_LEVEL(add_rms_norm_f32, (float* res, const float* x, const float* w, float* out, int64_t b, int64_t e,
                                   int64_t n, float eps, bool add),
               (res, x, w, out, b, e, n, eps, add), add_rms_norm_rows(res, x, w, out, b, e, n, eps, add))
FOLO_PER_LEVEL(add_rms_norm_bf16, (c10::BFloat16* res, const c10::BFloat16* x, const c10::BFloat16* w,
                                    c10::BFloat16* out, int64_t b, int64_t e, int64_t n, float eps, bool add),
               (res, x, w, out, b, e, n, eps, add), add_rms_norm_rows(res, x, w, out, b, e, n, eps, add))
FOLO_INLINE void add_rms_norm_dispatch(float* res, const float* x, const float* w, float* out, int64_t b,
                                       int64_t e, int64_t n, float eps, bool add) {
  add_rms_norm_f32(res, x, w, out, b, e, n, eps, add);
}
FOLO_INLINE void add_rms_norm_dispatch(c10::BFloat16* res, const c10::BFloat16* x, const c10::BFloat16* w,
                                       c10::BFloat16* out, int64_t b, int64_t e, int64_t n, float eps, bool add) {
  add_rms_norm_bf16(res, x, w, out, b, e, n, eps, add);
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16");
}

template <typename F>
void dispatch_dtype(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<c10::BFloat16*>(nullptr));
  }
}

int64_t grain_rows(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_elements)); }

// residual (in place) += x; returns RMSNorm(residual) * weight. add=false: no residual, x is normed.
at::Tensor norm_impl(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps, bool add) {
  check_rows(residual, "residual");
  check_rows(x, "x");
  check_rows(weight, "weight");
  const int64_t n = weight.numel();
  TORCH_CHECK(weight.dim() == 1 && n > 0 && residual.size(-1) == n, "weight must be [hidden], the rows' last dim");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual must have one shape");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type() && weight.scalar_type() == x.scalar_type(),
              "x, residual and weight must share one dtype");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  dispatch_dtype(x.scalar_type(), [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    T* res = residual.mutable_data_ptr<T>();
    const T* src = x.const_data_ptr<T>();
    const T* w = weight.const_data_ptr<T>();
    T* dst = out.mutable_data_ptr<T>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t b, int64_t e) {
      add_rms_norm_dispatch(res, src, w, dst, b, e, n, static_cast<float>(eps), add);
    });
  });
  return out;
}

// ---- rotary + paged KV store ------------------------------------------------------------------

template <typename T>
struct RotaryProblem {
  const T* qkv;           // [tokens, row_stride]: q heads, then k heads, then v heads
  int64_t row_stride;
  const T* cos;           // [tokens, D], rows rope_stride apart
  const T* sin;           // [tokens, D], sign-folded: (-sin | sin)
  int64_t rope_stride;
  const T* q_weight;      // [D] or null: per-head RMSNorm before rotary
  const T* k_weight;
  float eps;
  T* q_out;               // [tokens, Hq, D]
  T* k_out;               // [tokens, Hkv, D]
  void* k_cache;          // [slots, Hkv, D] in T, or [slots, Hkv, D + kKvScaleBytes] bytes (kv_format)
  void* v_cache;
  const int64_t* slots;
  int64_t num_heads, num_kv_heads, head_dim;
  int kv_format;          // 0: rows in T; else a KvFormat
};

// One K or V row quantized as folovllm/attention/kv_quant.py does (same roundings): scale = absmax / the
// format's largest code (at least 2^-14), rounded to float16; codes = x / scale clamped to that range, rounded to the format.
template <typename T>
FOLO_INLINE void quantize_kv_row(const T* x, int64_t D, KvFormat format, uint8_t* dst) {
  const float max_code = format == KvFormat::kInt8 ? 127.f : format == KvFormat::kFp8E4m3 ? 448.f : 57344.f;
  float absmax = 0.f;
  for (int64_t d = 0; d < D; ++d) absmax = std::max(absmax, std::abs(to_float(x[d])));
  const c10::Half scale_h(std::max(absmax / max_code, 0x1p-14f));  // float16's smallest normal at least
  const float scale = static_cast<float>(scale_h);
  for (int64_t d = 0; d < D; ++d) {
    const float v = std::clamp(to_float(x[d]) / scale, -max_code, max_code);
    if (format == KvFormat::kInt8) {
      dst[d] = static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(v)));
    } else if (format == KvFormat::kFp8E4m3) {
      dst[d] = c10::Float8_e4m3fn(v).x;
    } else {
      dst[d] = c10::Float8_e5m2(v).x;
    }
  }
  std::memcpy(dst + D, &scale_h.x, kKvScaleBytes);
}

// One head row: optional RMSNorm, then x * cos + [x2, x1] * (-sin | sin), each product rounded as torch.
template <typename T>
FOLO_INLINE void rotate_head(const T* src, const T* weight, float eps, const T* cos, const T* sin, T* dst,
                             float* buf, int64_t D) {
  for (int64_t d = 0; d < D; ++d) buf[d] = to_float(src[d]);
  if (weight != nullptr) {
    const float inv = inv_rms(buf, D, eps);
    for (int64_t d = 0; d < D; ++d) buf[d] = round_to<T>(round_to<T>(buf[d] * inv) * to_float(weight[d]));
  }
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) {
    const float other = buf[d < half ? d + half : d - half];
    const float a = round_to<T>(buf[d] * to_float(cos[d]));
    const float b = round_to<T>(other * to_float(sin[d]));
    dst[d] = from_float<T>(a + b);
  }
}

template <typename T>
FOLO_INLINE void rotary_rows(const RotaryProblem<T>& p, int64_t begin, int64_t end) {
  const int64_t D = p.head_dim;
  std::vector<float> buf(D);
  for (int64_t t = begin; t < end; ++t) {
    const T* row = p.qkv + t * p.row_stride;
    const T* cos = p.cos + t * p.rope_stride;
    const T* sin = p.sin + t * p.rope_stride;
    for (int64_t h = 0; h < p.num_heads; ++h)
      rotate_head(row + h * D, p.q_weight, p.eps, cos, sin, p.q_out + (t * p.num_heads + h) * D, buf.data(), D);
    const int64_t kv_width = p.num_kv_heads * D;
    T* k_dst = p.k_out + t * kv_width;
    const T* k_src = row + p.num_heads * D;
    for (int64_t h = 0; h < p.num_kv_heads; ++h)
      rotate_head(k_src + h * D, p.k_weight, p.eps, cos, sin, k_dst + h * D, buf.data(), D);
    const int64_t slot = p.slots[t];
    if (slot < 0) continue;  // a padding row owns no cache slot
    if (p.kv_format == 0) {
      std::memcpy(static_cast<T*>(p.k_cache) + slot * kv_width, k_dst, kv_width * sizeof(T));
      std::memcpy(static_cast<T*>(p.v_cache) + slot * kv_width, k_src + kv_width, kv_width * sizeof(T));
      continue;
    }
    const int64_t row_bytes = D + kKvScaleBytes;
    const KvFormat format = static_cast<KvFormat>(p.kv_format);
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      const int64_t at = (slot * p.num_kv_heads + h) * row_bytes;
      quantize_kv_row(k_dst + h * D, D, format, static_cast<uint8_t*>(p.k_cache) + at);
      quantize_kv_row(k_src + kv_width + h * D, D, format, static_cast<uint8_t*>(p.v_cache) + at);
    }
  }
}

FOLO_PER_LEVEL(rotary_f32, (const RotaryProblem<float>& p, int64_t b, int64_t e), (p, b, e), rotary_rows(p, b, e))
FOLO_PER_LEVEL(rotary_bf16, (const RotaryProblem<c10::BFloat16>& p, int64_t b, int64_t e), (p, b, e),
               rotary_rows(p, b, e))
FOLO_INLINE void rotary_dispatch(const RotaryProblem<float>& p, int64_t b, int64_t e) { rotary_f32(p, b, e); }
FOLO_INLINE void rotary_dispatch(const RotaryProblem<c10::BFloat16>& p, int64_t b, int64_t e) {
  rotary_bf16(p, b, e);
}

}  // namespace

at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  return norm_impl(residual, x, weight, eps, true);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor alias = x;  // not written: add=false only reads it
  return norm_impl(alias, x, weight, eps, false);
}

// qkv [T, (Hq + 2 Hkv) D] (rows may be strided) -> (q [T, Hq, D], k [T, Hkv, D], v view [T, Hkv, D]);
// k and v are stored at slot_mapping[t] of the caches [num_blocks, block_size, Hkv, D].
std::tuple<at::Tensor, at::Tensor, at::Tensor> rotary_store_kv(
    const at::Tensor& qkv, int64_t num_heads, int64_t num_kv_heads, const at::Tensor& cos, const at::Tensor& sin,
    const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight, double eps,
    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv must be a CPU [T, width] tensor "
              "with contiguous rows");
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "qkv must be float32 or bfloat16");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.is_contiguous() &&
              v_cache.is_contiguous(), "the caches must be contiguous [num_blocks, block_size, Hkv, D]");
  const int kv_format = kv_format_of(k_cache.scalar_type());
  const int64_t T = qkv.size(0), D = k_cache.size(3) - (kv_format ? kKvScaleBytes : 0);
  TORCH_CHECK(k_cache.size(2) == num_kv_heads && D % 2 == 0 && num_heads > 0,
              "the caches' heads and head_dim must match num_kv_heads and an even head_dim");
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * D, "qkv width must be (Hq + 2 Hkv) * head_dim");
  TORCH_CHECK(cos.device().is_cpu() && cos.sizes() == sin.sizes() && cos.strides() == sin.strides() &&
              cos.numel() == T * D && cos.size(0) == T && cos.size(-1) == D && cos.stride(-1) == 1 &&
              (cos.dim() == 2 || (cos.dim() == 3 && cos.size(1) == 1)),
              "cos and sin must be [T, head_dim] or [T, 1, head_dim] with contiguous rows of one stride");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&cos, &sin, &k_cache, &v_cache})
    TORCH_CHECK(t->scalar_type() == dtype || (kv_format && t->scalar_type() == k_cache.scalar_type()),
                "qkv, cos, sin and the caches must share one dtype (or the caches one int8/fp8 dtype)");
  for (const auto* w : {&q_weight, &k_weight})
    if (w->has_value()) {
      check_rows(**w, "q/k norm weight");
      TORCH_CHECK((*w)->numel() == D && (*w)->scalar_type() == dtype, "q/k norm weights must be [head_dim] in qkv's dtype");
    }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 && slot_mapping.numel() == T,
              "slot_mapping must be an int64 tensor, one slot per token");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot_data = slot_mapping.const_data_ptr<int64_t>();
  std::vector<int64_t> slots(T);
  for (int64_t t = 0; t < T; ++t) {
    slots[t] = slot_data[t * slot_mapping.stride(0)];
    TORCH_CHECK(slots[t] < num_slots, "slot ", slots[t], " lies past the cache's ", num_slots, " slots");
  }

  at::Tensor q_out = at::empty({T, num_heads, D}, qkv.options());
  at::Tensor k_out = at::empty({T, num_kv_heads, D}, qkv.options());
  at::Tensor v = qkv.narrow(1, (num_heads + num_kv_heads) * D, num_kv_heads * D).view({T, num_kv_heads, D});
  dispatch_dtype(dtype, [&](auto* typed) {
    using S = std::remove_pointer_t<decltype(typed)>;
    RotaryProblem<S> p{qkv.const_data_ptr<S>(), qkv.stride(0), cos.const_data_ptr<S>(), sin.const_data_ptr<S>(),
                       cos.stride(0),
                       q_weight.has_value() ? q_weight->const_data_ptr<S>() : nullptr,
                       k_weight.has_value() ? k_weight->const_data_ptr<S>() : nullptr, static_cast<float>(eps),
                       q_out.mutable_data_ptr<S>(), k_out.mutable_data_ptr<S>(), k_cache.data_ptr(),
                       v_cache.data_ptr(), slots.data(), num_heads, num_kv_heads, D, kv_format};
    at::parallel_for(0, T, grain_rows(qkv.size(1)), [&](int64_t b, int64_t e) { rotary_dispatch(p, b, e); });
  });
  return {q_out, k_out, v};
}

// gate_up [..., 2 I] -> silu(gate) * up [..., I]
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "gate_up's last dim must be even: [gate | up]");
  const int64_t width = gate_up.size(-1) / 2;
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = width;
  at::Tensor out = at::empty(shape, gate_up.options());
  const int64_t rows = width == 0 ? 0 : out.numel() / width;
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "silu_and_mul needs the avx2 tier at least; this one is ", tier_name(tier()));
  const bool wide = tier_at_least(Tier::kAvx512);
  dispatch_dtype(gate_up.scalar_type(), [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    using Bits = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;  // bf16 as its bits
    const Bits* in = reinterpret_cast<const Bits*>(gate_up.const_data_ptr<T>());
    Bits* dst = reinterpret_cast<Bits*>(out.mutable_data_ptr<T>());
    at::parallel_for(0, rows, grain_rows(width), [&](int64_t b, int64_t e) {
      if (wide) {
        avx512::silu_mul_rows(in, dst, b, e, width);
      } else {
        avx2::silu_mul_rows(in, dst, b, e, width);
      }
    });
  });
  return out;
}

}  // namespace folovllm::cpu
