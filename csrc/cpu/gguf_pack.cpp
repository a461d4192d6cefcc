// gguf_pack: a GGUF tensor's file blocks (uint8 [rows, bytes per row], as the file stores them) written into
// gguf_gemm's packed layout (gguf_layout.h), the same bytes as folovllm/model/quantization/gguf_native.py's
// pack_gguf (the readable reference, which the tests hold this op to). The load's one pass over each
// weight: threads take column blocks, each decodes its 16 rows' file blocks one at a time into their codes,
// then scatters the scales and codes to their lanes. Portable C++ (no tier): it runs wherever the library
// loads.
#include "gguf_layout.h"
#include "ops.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace folovllm::cpu {
namespace {

// The file's own block of a type: inputs and bytes.
struct FileBlock {
  int64_t weights;
  int64_t bytes;
};

constexpr FileBlock file_block(GgufType type) {
  switch (type) {
    case GgufType::kQ4_0: return {32, 18};
    case GgufType::kQ4_1: return {32, 20};
    case GgufType::kQ8_0: return {32, 34};
    case GgufType::kQ4_K: return {256, 144};
    case GgufType::kQ5_K: return {256, 176};
    case GgufType::kQ6_K: return {256, 210};
  }
  return {0, 0};
}

// 16 bytes of nibbles (Q4_0, Q4_1): the block's first 16 codes low, the next 16 high.
void nibbles16(const uint8_t* qs, uint8_t* q) {
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 15;
    q[16 + i] = qs[i] >> 4;
  }
}

// Q4_K's and Q5_K's 128 bytes of nibbles: per 32 bytes, 32 codes low, then 32 high.
void nibbles128(const uint8_t* qs, uint8_t* q) {
  for (int h = 0; h < 4; ++h)
    for (int i = 0; i < 32; ++i) {
      q[64 * h + i] = qs[32 * h + i] & 15;
      q[64 * h + 32 + i] = qs[32 * h + i] >> 4;
    }
}

// One file block -> its codes in input order (the file's unsigned values; Q8_0's int8 codes as bytes).
template <GgufType T>
void decode_codes(const uint8_t* b, uint8_t* q) {
  if constexpr (T == GgufType::kQ4_0) {
    nibbles16(b + 2, q);
  } else if constexpr (T == GgufType::kQ4_1) {
    nibbles16(b + 4, q);
  } else if constexpr (T == GgufType::kQ8_0) {
    std::memcpy(q, b + 2, 32);
  } else if constexpr (T == GgufType::kQ4_K) {
    nibbles128(b + 16, q);
  } else if constexpr (T == GgufType::kQ5_K) {  // the fifth bits: bit j of byte i of 32 is code 32 j + i's
    nibbles128(b + 48, q);
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 32; ++i) q[32 * j + i] |= ((b[16 + i] >> j) & 1) << 4;
  } else {  // Q6_K, per half: 64 bytes of nibbles (64 codes low, then 64 high), 32 bytes of two-bit fields
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      uint8_t* out = q + 128 * h;
      for (int i = 0; i < 64; ++i) {
        out[i] = ql[i] & 15;
        out[64 + i] = ql[i] >> 4;
      }
      for (int s = 0; s < 4; ++s)
        for (int i = 0; i < 32; ++i) out[32 * s + i] |= ((qh[i] >> (2 * s)) & 3) << 4;
    }
  }
}

void put_u16(uint8_t* dst, const uint8_t* src) { std::memcpy(dst, src, 2); }
void put_u32(uint8_t* dst, uint32_t v) { std::memcpy(dst, &v, 4); }  // little-endian, as numpy's view

// Lane j's record in one super-block's meta area (gguf_layout.h) from its file block b.
template <GgufType T>
void write_meta(const uint8_t* b, int j, uint8_t* meta) {
  if constexpr (T == GgufType::kQ6_K) {
    put_u16(meta + 2 * j, b + 208);
    for (int i = 0; i < 16; ++i) meta[32 + 16 * i + j] = b[192 + i];
    return;
  }
  put_u16(meta + 2 * j, b);
  if constexpr (T == GgufType::kQ4_1 || T == GgufType::kQ4_K || T == GgufType::kQ5_K) put_u16(meta + 32 + 2 * j, b + 2);
  if constexpr (T == GgufType::kQ4_K || T == GgufType::kQ5_K) {  // the 12 bytes of six-bit scales and mins
    const uint8_t* s = b + 4;
    for (int i = 0; i < 4; ++i) {
      meta[64 + 16 * i + j] = s[i] & 0x3F;
      meta[192 + 16 * i + j] = s[4 + i] & 0x3F;
      meta[64 + 16 * (4 + i) + j] = (s[8 + i] & 0x0F) | ((s[i] >> 2) & 0x30);
      meta[192 + 16 * (4 + i) + j] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
  }
}

// Lane j's codes of one group (q: the group's group_k codes) at the group's first byte.
template <GgufType T>
void write_group(const uint8_t* q, int j, uint8_t* group) {
  constexpr int64_t group_k = gguf_layout_of(T).group_k;
  if constexpr (T == GgufType::kQ8_0) {  // pairs of [16 lanes][2] bytes
    for (int64_t p = 0; p < group_k / 2; ++p) std::memcpy(group + (16 * p + j) * 2, q + 2 * p, 2);
    return;
  }
  constexpr int64_t chunks = group_k / 8;
  for (int64_t c = 0; c < chunks; ++c) {  // low nibbles of pair p at bits 4p (even code), 16 + 4p (odd)
    uint32_t word = 0;
    for (int p = 0; p < 4; ++p)
      word |= static_cast<uint32_t>(q[8 * c + 2 * p] & 15) << (4 * p) |
              static_cast<uint32_t>(q[8 * c + 2 * p + 1] & 15) << (16 + 4 * p);
    put_u32(group + (16 * c + j) * 4, word);
  }
  if constexpr (T == GgufType::kQ5_K || T == GgufType::kQ6_K) {  // the bits above the nibble
    constexpr int width = T == GgufType::kQ5_K ? 1 : 2;
    constexpr uint32_t mask = (1u << width) - 1;
    uint32_t word = 0;
    for (int64_t c = 0; c < chunks; ++c)
      for (int p = 0; p < 4; ++p) {
        const int shift = width * (4 * static_cast<int>(c) + p);
        word |= (q[8 * c + 2 * p] >> 4 & mask) << shift | (q[8 * c + 2 * p + 1] >> 4 & mask) << (16 + shift);
      }
    put_u32(group + (16 * chunks + j) * 4, word);
  }
}

// Column blocks [b0, b1) of a [rows, cols] tensor of type T: per super-block, the 16 rows' file blocks decoded,
// then written group by group (each group's bytes whole before the next).
template <GgufType T>
void pack_blocks(const uint8_t* in, int64_t cols, uint8_t* dst, int64_t b0, int64_t b1) {
  constexpr GgufLayout l = gguf_layout_of(T);
  constexpr FileBlock fb = file_block(T);
  constexpr int64_t groups = l.super_k / l.group_k;
  const int64_t supers = cols / l.super_k, row_bytes = supers * fb.bytes;
  const int64_t meta_area = gguf_meta_area(l, cols), block_bytes = gguf_block_bytes(l, cols);
  alignas(64) uint8_t q[kGgufBlockCols][l.super_k];
  for (int64_t b = b0; b < b1; ++b) {
    uint8_t* block = dst + b * block_bytes;
    std::memset(block + supers * l.meta_bytes, 0, meta_area - supers * l.meta_bytes);
    const uint8_t* rows = in + b * kGgufBlockCols * row_bytes;
    for (int64_t s = 0; s < supers; ++s) {
      for (int j = 0; j < kGgufBlockCols; ++j) {
        const uint8_t* file = rows + j * row_bytes + s * fb.bytes;
        write_meta<T>(file, j, block + s * l.meta_bytes);
        decode_codes<T>(file, q[j]);
      }
      uint8_t* group = block + meta_area + s * groups * l.group_code_bytes;
      for (int64_t g = 0; g < groups; ++g, group += l.group_code_bytes)
        for (int j = 0; j < kGgufBlockCols; ++j) write_group<T>(q[j] + g * l.group_k, j, group);
    }
  }
}

}  // namespace

// out (uint8 [rows / 16 * block bytes]) <- blocks (uint8 [rows, bytes per row]) of ggml type `type`, cols inputs.
void gguf_pack(at::Tensor& out, const at::Tensor& blocks, int64_t type, int64_t cols) {
  GgufLayout l;
  TORCH_CHECK(gguf_layout(type, l), "gguf_pack: ggml type ", type, " is not held packed");
  const GgufType t = static_cast<GgufType>(type);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2, "gguf_pack: blocks must be uint8 [rows, bytes]");
  const int64_t rows = blocks.size(0);
  TORCH_CHECK(rows > 0 && rows % kGgufBlockCols == 0 && cols > 0 && cols % l.super_k == 0, "gguf_pack: a [", rows,
              " x ", cols, "] tensor of ggml type ", type, " cannot be held packed");
  const int64_t row_bytes = cols / file_block(t).weights * file_block(t).bytes;
  TORCH_CHECK(blocks.size(1) == row_bytes, "gguf_pack: ", cols, " inputs of ggml type ", type, " take ", row_bytes,
              " bytes a row, not ", blocks.size(1));
  const int64_t n_blocks = rows / kGgufBlockCols;
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous() &&
                  out.size(0) == n_blocks * gguf_block_bytes(l, cols),
              "gguf_pack: out must be contiguous uint8 [", n_blocks * gguf_block_bytes(l, cols), "]");
  const at::Tensor src = blocks.contiguous();
  const uint8_t* in = src.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n_blocks, 1, [&](int64_t b0, int64_t b1) {
    switch (t) {
      case GgufType::kQ4_0: return pack_blocks<GgufType::kQ4_0>(in, cols, dst, b0, b1);
      case GgufType::kQ4_1: return pack_blocks<GgufType::kQ4_1>(in, cols, dst, b0, b1);
      case GgufType::kQ8_0: return pack_blocks<GgufType::kQ8_0>(in, cols, dst, b0, b1);
      case GgufType::kQ4_K: return pack_blocks<GgufType::kQ4_K>(in, cols, dst, b0, b1);
      case GgufType::kQ5_K: return pack_blocks<GgufType::kQ5_K>(in, cols, dst, b0, b1);
      case GgufType::kQ6_K: return pack_blocks<GgufType::kQ6_K>(in, cols, dst, b0, b1);
    }
  });
}

}  // namespace folovllm::cpu
