// A quantized KV cache row (folovllm/attention/kv_quant.py is the reference): head_dim one-byte codes, then the
// row's scale as float16 bits; value = code * scale. Plain C++ (no torch header): the per-tier decode form
// reads rows through it, the fused rotary op writes them.
#pragma once

#include <cstdint>
#include <cstring>

namespace folovllm::cpu {

enum class KvFormat : int { kInt8 = 1, kFp8E4m3 = 2, kFp8E5m2 = 3 };
constexpr int64_t kKvScaleBytes = 2;

// A one-byte float's bits less its sign, shifted up by kv_fp8_shift, are an fp32 whose exponent bias is
// 127 instead of the format's: times kv_fp8_factor they are the value exactly, subnormals included.
constexpr int kv_fp8_shift(KvFormat f) { return f == KvFormat::kFp8E4m3 ? 20 : 21; }
constexpr float kv_fp8_factor(KvFormat f) { return f == KvFormat::kFp8E4m3 ? 0x1p120f : 0x1p112f; }

// float16 bits -> float, by the same shift (13 bits, bias 15 -> 127: times 2^112).
inline float kv_half_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h & 0x7fff) << 13;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  f *= 0x1p112f;
  return (h & 0x8000) ? -f : f;
}

// The scale stored after a row's `dim` codes.
inline float kv_row_scale(const uint8_t* row, int64_t dim) {
  uint16_t h;
  std::memcpy(&h, row + dim, sizeof h);
  return kv_half_to_float(h);
}

}  // namespace folovllm::cpu
