// What the per-tier kernels (csrc/cpu/tiered/, each built once per tier into its own namespace) offer the
// ops that dispatch to them by the current tier. Plain pointers: these sources include no torch header,
// so each tier's build takes seconds.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

namespace folovllm::cpu {

// Weights a linear kernel's thread multiplies next, pulled into L2 while it multiplies the current ones
// (both forms, csrc/cpu/linear_bf16.h and tiered/linear.cpp): for each K pair p, `lines` cache lines from
// at + p * stride. Empty: nothing.
struct NextWeights {
  const char* at = nullptr;
  int64_t stride = 0;
  int lines = 0;

  inline void prefetch(int64_t p) const {
    for (int l = 0; l < lines; ++l) _mm_prefetch(at + p * stride + l * 64, _MM_HINT_T1);
  }
};

// Work items [0, n) that a parallel region's threads share. Shared (`next` set), each thread claims its next run
// when it needs one: with `chunked` a share of those left that shrinks as they run out (a sixth of them at 2
// threads, down to one item), else one item. A thread that started late or lost its core a while takes fewer,
// and none idles at the end waiting on another's fixed half. Fixed (`next` null): the one range [begin, end),
// handed out once, as at::parallel_for splits. Which thread runs an item never changes what the item computes.
struct ItemClaims {
  int64_t* next = nullptr;
  int64_t n = 0;
  int threads = 1;
  bool chunked = true;
  int64_t begin = 0, end = 0;

  // The next run [*b, *e); false (and both at the end) when none is left.
  inline bool claim(int64_t* b, int64_t* e) {
    if (next == nullptr) {
      *b = begin, *e = end, begin = end;
      return *b < *e;
    }
    int64_t first = __atomic_load_n(next, __ATOMIC_RELAXED);
    for (;;) {
      if (first >= n) {
        *b = *e = n;
        return false;
      }
      const int64_t share = chunked ? (n - first) / (3 * threads) : 1, count = share > 1 ? share : 1;
      if (__atomic_compare_exchange_n(next, &first, first + count, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        *b = first, *e = first + count;
        return true;
      }
    }
  }
};

// What a linear kernel reads as x [M, K]: fp32, or bf16 that each thread widens chunk by chunk as it goes
// (one of the two is null).
struct LinearIn {
  const float* f32;
  const uint16_t* bf16;
};

// Where a linear kernel writes y [M, N]: fp32 or bf16 (one of the two is null).
struct LinearOut {
  float* f32;
  uint16_t* bf16;
  int64_t N;
};

// One kv head's rows in a layer's paged K/V cache (fp32 or bf16, as the query): token t of a sequence sits
// at element (table[t / block_size] * block_size + t % block_size) * token_stride + offset of k and v.
struct PagedHead {
  const void* k;
  const void* v;
  const int64_t* table;
  int64_t block_size, token_stride, offset;
};

// The fp32 prefill form (tiered/attention_prefill.cpp): query rows per work item and keys per tile, and the
// floats of one thread's workspace for head_dim `dim`.
constexpr int64_t kPrefillTile = 48;  // whole register blocks at every tier: 6 rows x 2 ymm, 4 rows x 3 zmm
constexpr int64_t prefill_workspace_floats(int64_t dim) {
  return 2 * kPrefillTile * dim + kPrefillTile * kPrefillTile + 2 * kPrefillTile;
}

// One LoRA-wrapped linear's adapters in slots (csrc/cpu/lora.cpp builds them from the op's tensors): A fp32
// [rows, in], slot s owning rows [a_start[s], a_start[s + 1]) and pieces [p_start[s], p_start[s + 1]); a
// piece (5 int64: A rows [kb, ke), outputs [lo, hi), offset) adds xa[kb..ke) times its Bt [ke - kb, hi - lo]
// fp32 at b + offset.
constexpr int64_t kLoraRowBlock = 8;  // rows of one slot a kernel call takes together
struct LoraTables {
  const float* a;
  const int64_t* a_start;
  const float* b;
  const int64_t* pieces;
  const int64_t* p_start;
  int64_t in;
};

#define FOLO_TIERED_KERNELS                                                                                   \
  /* The work items it claims of y = x W^T (x fp32 or bf16 [M, K]; W bf16 packed [N/64][K/2][64][2]; bias fp32 */  \
  /* [N] or null), linear_item_count(M, N) in all: an item is one weight block, or one panel of it where M  */  \
  /* is large enough, times input rows [128 c, 128 c + 128), c counting chunks after all blocks of one chunk. */ \
  int64_t linear_item_count(int64_t M, int64_t N);                                                             \
  void linear_items(const LinearIn& x, int64_t M, int64_t K, const uint32_t* w, const float* bias,              \
                    const LinearOut& out, ItemClaims& claims);                                                  \
  /* x's rows [first, last) as fp32 into out ((last - first) K floats), laid out as the tiles read them     */ \
  /* (AVX2: groups of up to 6 rows, [K pair][row][2]; else row after row): linear_argmax_part's input.       */ \
  void linear_group_rows(const LinearIn& x, int64_t K, int64_t first, int64_t last, float* out);               \
  /* Each row's best of x W^T (x grouped: linear_group_rows) over weight blocks [block0, block1)            */ \
  /* (bf16-rounded first with round_bf16): updates best[M], best_id[M] where strictly larger.               */ \
  void linear_argmax_part(const float* x, int64_t M, int64_t K, const uint32_t* w, int64_t block0,             \
                          int64_t block1, bool round_bf16, float* best, int64_t* best_id);                  \
  /* One decode query row over kv_heads consecutive kv heads from `kv`'s (rows dim apart), `heads` query   */  \
  /* heads each (query, out [kv_heads x heads, dim], fp32 or bf16), keys [first_key, num_keys); dim a       */  \
  /* multiple of the tier's vector width. With `next`, the keys [next_first, next_end) read next           */  \
  /* (look-ahead: their first rows are prefetched at the last tile).                                       */  \
  void decode_attention(const void* query, void* out, bool bf16, int64_t kv_heads, int64_t heads, int64_t dim,   \
                        float scale, const PagedHead& kv, int64_t first_key, int64_t num_keys,                   \
                        const PagedHead* next, int64_t next_first, int64_t next_end);                            \
  /* The same over a quantized cache (kv_quant.h; `format` a KvFormat): PagedHead offsets count bytes, rows */  \
  /* of dim + kKvScaleBytes; no look-ahead.                                                              */  \
  void decode_attention_quantized(const void* query, void* out, bool bf16, int64_t heads, int64_t dim,          \
                                  float scale, const PagedHead& kv, int format, int64_t first_key,             \
                                  int64_t num_keys);                                                           \
  /* Causal prefill of one fresh chunk's kv head: K, V rows (fp32 or bf16, row strides) widened into the    */ \
  /* fp32 layouts of attention_prefill.cpp (len rounded up to kPrefillTile rows, zero-padded); then one item: */ \
  /* `rows` query rows (q tile q_tile, row stride q_stride) of one head over key tiles 0..q_tile into out.   */ \
  /* dim a multiple of the tier's vector width; ws: prefill_workspace_floats(dim) floats.                 */ \
  void prefill_pack(const void* k, const void* v, bool bf16, int64_t k_stride, int64_t v_stride, int64_t len,   \
                    int64_t dim, float* keys, float* values);                                                  \
  void prefill_item(const void* q, bool bf16, int64_t q_stride, void* out, int64_t out_stride, int64_t rows,     \
                    int64_t q_tile, int64_t dim, float scale, const float* keys, const float* values, float* ws); \
  /* Rows [begin, end) of silu(gate) * up: in [rows, 2 width] = [gate | up], out [rows, width]; fp32 or bf16 */ \
  void silu_mul_rows(const float* in, float* out, int64_t begin, int64_t end, int64_t width);                  \
  void silu_mul_rows(const uint16_t* in, uint16_t* out, int64_t begin, int64_t end, int64_t width);              \
  /* Column blocks [b0, b1) of the int4 matmul y = x W^T (quant_int4.h's packing): x fp32 [M, K], xsum fp32 */  \
  /* [M, groups] (each row's sum per group), scales/zeros [N / 16, groups, 16] fp32 or bf16 (bf16_scales). */  \
  void int4_blocks(const float* x, int64_t M, int64_t K, const float* xsum, int64_t groups,                    \
                   const uint32_t* codes, const void* scales, const void* zeros, bool bf16_scales,             \
                   int64_t group_size, const LinearOut& out, int64_t b0, int64_t b1);                            \
  /* Column blocks [b0, b1) of the int8 matmul (quant_int8.h's packing), x fp32 [M, K], scales [N] fp32 or bf16; */ \
  /* the argmax form updates best[M] / best_id[M] (from -inf) where a logit (bf16-rounded: round_bf16) is larger. */ \
  void int8_blocks(const float* x, int64_t M, int64_t K, const int8_t* codes, const void* scales,              \
                   bool bf16_scales, const LinearOut& out, int64_t b0, int64_t b1);                            \
  void int8_argmax_blocks(const float* x, int64_t M, int64_t K, const int8_t* codes, const void* scales,       \
                          bool bf16_scales, bool round_bf16, float* best, int64_t* best_id, int64_t b0,        \
                          int64_t b1);                                                                         \
  /* W4A8 without VNNI (quant_int4_a8.h's rounding and layout): fp32 rows [M, K] -> a int8 [M, K] (nibble  */ \
  /* order), scale and sum [M, groups]; then column blocks [b0, b1) of y from them.                        */ \
  void int4_a8_quantize(const float* x, int64_t M, int64_t K, int64_t group_size, int8_t* a, float* scale,     \
                        float* sum);                                                                           \
  void int4_a8_blocks(const int8_t* a, int64_t M, int64_t K, const float* scale, const float* sum,             \
                      int64_t groups, const uint32_t* codes, const void* scales, const void* zeros,             \
                      bool bf16_scales, int64_t group_size, const LinearOut& out, int64_t b0, int64_t b1);    \
  /* Column blocks [b0, b1) of one part of gguf_gemm (gguf_layout.h: its ggml type, packed blocks at data,  */ \
  /* block_bytes apart, codes meta_area into each), x fp32 [M, K], xsum16 [M, K / 16] its sums per 16      */ \
  /* inputs; outputs from column col0 of y.                                                                */ \
  void gguf_blocks(int64_t type, const float* x, int64_t M, int64_t K, const float* xsum16,                    \
                   const uint8_t* data, int64_t block_bytes, int64_t meta_area, const LinearOut& out,           \
                   int64_t col0, int64_t b0, int64_t b1);                                                      \
  /* Rows [begin, end) of out += each row's adapter delta (tiered/lora.cpp); row_slot[n] -1: none. x, out  */ \
  /* fp32 or bf16 with row strides; ws: kLoraRowBlock (in + the largest slot's A rows + out width) floats. */ \
  void lora_rows(const float* x, int64_t x_stride, float* out, int64_t out_stride, const int64_t* row_slot,     \
                 int64_t begin, int64_t end, const LoraTables& tables, float* ws);                              \
  void lora_rows(const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride,                       \
                 const int64_t* row_slot, int64_t begin, int64_t end, const LoraTables& tables, float* ws);

namespace avx2 {
FOLO_TIERED_KERNELS
}  // namespace avx2
namespace avx512 {
FOLO_TIERED_KERNELS
}  // namespace avx512

#undef FOLO_TIERED_KERNELS

}  // namespace folovllm::cpu
