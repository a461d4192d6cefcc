// GGUF block types held in their own packed layout (folovllm/model/quantization/gguf_native.py packs them once
// at load): the sizes every form of gguf_gemm (quant_gguf.h, tiered/gguf.cpp) and gguf_rows reads them by.
// Plain C++, no torch: the per-tier sources include it too.
//
// A weight [N, K] is held in column blocks of 16 outputs (one vector of fp32 lanes); each block is its
// scales for all of K (the meta area, padded to 64 bytes), then its codes for all of K, one group of
// inputs after another. The values are the file's own: fp16 d (and dmin, m), the sub-block scales as the
// integers the file stores, the codes; a kernel computes each group's scale from them in fp32, exactly as
// the gguf package's dequantize does, so a weight is the file's value to the last bit.
//
// Meta area, per super-block (the type's GGUF block of super_k inputs), lane j = output j of the block:
//   Q4_0, Q8_0: d[16] fp16                      Q4_1: d[16], m[16] fp16
//   Q4_K, Q5_K: d[16], dmin[16] fp16, sc[8][16] u8, m[8][16] u8 (the six-bit scales and mins, unpacked)
//   Q6_K:       d[16] fp16, sc[16][16] i8
// Codes, per group of group_k inputs (one scale each): chunks of 8 inputs, 16 uint32 lanes each, lane j
// holding output j's low four bits of codes 2p and 2p + 1 at bits 4p and 16 + 4p (p = 0..3: quant_int4.h's
// order), then for
//   Q5_K (groups of 32): one more 16 lanes, the fifth bit of chunk c's pair p at bit 4c + p (even code)
//                        and 16 + 4c + p (odd);
//   Q6_K (groups of 16): one more 16 lanes, the top two bits of chunk c's pair p at bits 2 (4c + p) and
//                        16 + 2 (4c + p);
//   Q8_0 (groups of 32): no nibbles, 16 pairs of [16 lanes][2] int8 (quant_int8.h's pair order).
// So a pair of codes shifted into bits 0..6 of a 16-bit lane and or-ed with 0x3F80 is the bf16 value
// 1 + q / 2^b (b the code's bits: exact), and per group
//   sum_k x_k w_k = S sum_k x_k (1 + q_k / 2^b) + O sum_k x_k,  w = s q + z, S = 2^b s, O = z - 2^b s,
// with s and z from the meta area (Q8_0: w = d q, its codes exact in bf16 as they are, no O).
#pragma once

#include <cstdint>

namespace folovllm::cpu {

// The ggml type ids (gguf.GGMLQuantizationType) of the types held packed.
enum class GgufType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

struct GgufLayout {
  int64_t super_k;           // inputs per GGUF block (a meta record)
  int64_t group_k;           // inputs per scale
  int64_t meta_bytes;        // per column block and super-block
  int64_t group_code_bytes;  // per column block and group
};

constexpr int64_t kGgufBlockCols = 16;
constexpr int64_t kGgufAlign = 64;

// The layout of a type held packed (a constant where the type is: gguf_pack.cpp's per-type loops).
constexpr GgufLayout gguf_layout_of(GgufType type) {
  switch (type) {
    case GgufType::kQ4_0: return {32, 32, 32, 256};
    case GgufType::kQ4_1: return {32, 32, 64, 256};
    case GgufType::kQ8_0: return {32, 32, 32, 512};
    case GgufType::kQ4_K: return {256, 32, 320, 256};
    case GgufType::kQ5_K: return {256, 32, 320, 320};
    case GgufType::kQ6_K: return {256, 16, 288, 192};
  }
  return {0, 0, 0, 0};
}

// The layout of ggml type `type`; false for a type not held packed.
inline bool gguf_layout(int64_t type, GgufLayout& out) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kQ4_0:
    case GgufType::kQ4_1:
    case GgufType::kQ8_0:
    case GgufType::kQ4_K:
    case GgufType::kQ5_K:
    case GgufType::kQ6_K: out = gguf_layout_of(static_cast<GgufType>(type)); return true;
  }
  return false;
}

// Bytes of one column block's meta area for K inputs (padded to 64), and of the whole block.
inline int64_t gguf_meta_area(const GgufLayout& l, int64_t K) {
  return (K / l.super_k * l.meta_bytes + kGgufAlign - 1) / kGgufAlign * kGgufAlign;
}
inline int64_t gguf_block_bytes(const GgufLayout& l, int64_t K) {
  return gguf_meta_area(l, K) + K / l.group_k * l.group_code_bytes;
}

}  // namespace folovllm::cpu
