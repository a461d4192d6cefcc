// Greedy decoding's LM head on CPU, registered as torch.ops.folovllm.linear_argmax:
//   linear_argmax(x [M, K], packed)  int64 [M]: for each row of x, the index of its largest logit of
//                                    x @ weight^T (rounded to x's dtype, bf16 or fp32), the weight packed by
//                                    torch.ops.folovllm.linear_pack ([N/64][K/2][64 rows][2])
//
// At the AVX-512 BF16 tier bf16 x takes the form below; every other tier from avx2 on, and fp32 x, take the
// fp32 form of csrc/cpu/tiered/linear.cpp (linear_argmax_part), whose logits are the linear op's own there.
//
// A greedy step only needs each row's best token, so the [M, N] logits (N = the vocabulary, 49,152
// for SmolLM2) are never written: each 64-token block of logits lives in registers, is rounded to
// bf16 exactly as the bf16 linear kernel rounds its output, and only its maximum leaves. The result
// equals torch.argmax of that kernel's logits (the first index among equal maxima) for finite logits.
// Each logit is accumulated in the same order with the same instruction (vdpbf16ps over K pairs from
// zero), so the logits themselves are bit-identical to the linear kernel's. Up to 6 rows share each
// weight load (the linear kernel uses 4): 24 fp32 accumulators, 4 weight vectors and one broadcast in
// the 32 zmm registers. Work items are ranges of weight blocks on torch's intra-op threads; each keeps
// its own per-row best, reduced in block order at the end. Where the linear op takes its AMX form (an AMX
// host, 16 rows or more: linear_amx.h), the head is that op's logits and their argmax.

#include "isa.h"
#include "linear_bf16.h"
#include "linear_amx.h"
#include "ops.h"
#include "parallel_items.h"
#include "tiered.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>


namespace folovllm::cpu {
namespace {

constexpr int64_t kPartBlocks = 8;   // weight blocks per work item (512 tokens): 96 items for SmolLM2

// fp32 -> bf16 (round to nearest even, as the linear kernel stores) -> fp32
FOLO_TARGET_AVX512_BF16 inline __m512 round_bf16(__m512 v) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows [0, R) of x times weight block `block` (its first token id is block * 64): each row's best
// rounded logit in the block replaces best[m] / best_id[m] when strictly larger; `next` pulled into L2 on
// the way, as the linear kernel does.
template <int R>
FOLO_TARGET_AVX512_BF16 inline void block_argmax(const uint32_t* x, int64_t pairs, const __m512bh* wb, int64_t block,
                                          float* best, int64_t* best_id, NextWeights next) {
  __m512 acc[R][4];
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh* wp = wb + p * 4;
    next.prefetch(p);
    const __m512bh w0 = wp[0], w1 = wp[1], w2 = wp[2], w3 = wp[3];
    for (int m = 0; m < R; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * pairs + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xv, w0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xv, w1);
      acc[m][2] = _mm512_dpbf16_ps(acc[m][2], xv, w2);
      acc[m][3] = _mm512_dpbf16_ps(acc[m][3], xv, w3);
    }
  }
  for (int m = 0; m < R; ++m) {
    __m512 v[4];
    for (int j = 0; j < 4; ++j) v[j] = round_bf16(acc[m][j]);
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3])));
    if (!(top > best[m])) continue;  // an equal value in a later block is not the first maximum
    const __m512 topv = _mm512_set1_ps(top);
    for (int j = 0; j < 4; ++j) {
      const __mmask16 hit = _mm512_cmpeq_ps_mask(v[j], topv);
      if (hit != 0) {
        best[m] = top;
        best_id[m] = block * kBlockRows + j * 16 + __builtin_ctz(hit);
        break;
      }
    }
  }
}

// Work item `part`: weight blocks [part * kPartBlocks, ...) times every row of x. A block (64 x K) is
// read from memory once and stays in cache while every group of rows multiplies it.
FOLO_TARGET_AVX512_BF16 void part_argmax(const uint32_t* x, int64_t M, int64_t pairs, const __m512bh* w, int64_t blocks,
                                  int64_t part, float* best, int64_t* best_id) {
  const int64_t first = part * kPartBlocks, last = std::min(blocks, first + kPartBlocks);
  const int64_t groups = group_count(M);
  for (int64_t b = first; b < last; ++b) {
    const __m512bh* wb = w + b * pairs * 4;
    for (int64_t m = 0, g = 0; m < M; m += kMaxRows, ++g) {
      const NextWeights next = b + 1 < blocks ? next_block_slice(w, b + 1, pairs, g, groups) : NextWeights{};
      const uint32_t* xm = x + m * pairs;
      switch (std::min(kMaxRows, M - m)) {
        case 1: block_argmax<1>(xm, pairs, wb, b, best + m, best_id + m, next); break;
        case 2: block_argmax<2>(xm, pairs, wb, b, best + m, best_id + m, next); break;
        case 3: block_argmax<3>(xm, pairs, wb, b, best + m, best_id + m, next); break;
        case 4: block_argmax<4>(xm, pairs, wb, b, best + m, best_id + m, next); break;
        case 5: block_argmax<5>(xm, pairs, wb, b, best + m, best_id + m, next); break;
        default: block_argmax<kMaxRows>(xm, pairs, wb, b, best + m, best_id + m, next); break;
      }
    }
  }
}

}  // namespace

at::Tensor linear_argmax(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(tier_at_least(Tier::kAvx2), "the greedy head needs the avx2 tier at least; this one is ",
              tier_name(tier()));
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kBlockRows && packed.size(3) == 2 &&
              packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "greedy head: weight is not packed by folovllm.linear_pack");
  const int64_t blocks = packed.size(0), pairs = packed.size(1), K = pairs * 2;
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) && x.size(1) == K,
              "greedy head: x must be bfloat16 or float32 [M, ", K, "]");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0);
  at::Tensor out = at::empty({M}, x.options().dtype(at::kLong));
  if (M == 0) return out;
  // where the linear op takes the AMX form, its logits, written out: the tile unit rounds otherwise
  if (x.scalar_type() == at::kBFloat16 && amx_takes(M, K)) return linear(xc, packed, c10::nullopt).argmax(1);
  const int64_t parts = (blocks + kPartBlocks - 1) / kPartBlocks;
  std::vector<float> best(parts * M, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> best_id(parts * M, 0);
  if (x.scalar_type() == at::kBFloat16 && tier_at_least(Tier::kAvx512Bf16)) {
    const uint32_t* xp = reinterpret_cast<const uint32_t*>(xc.data_ptr<c10::BFloat16>());
    const __m512bh* wp = reinterpret_cast<const __m512bh*>(packed.data_ptr<c10::BFloat16>());
    parallel_runs(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) part_argmax(xp, M, pairs, wp, blocks, p, &best[p * M], &best_id[p * M]);
    });
  } else {
    const bool round_bf16 = x.scalar_type() == at::kBFloat16, wide = tier_at_least(Tier::kAvx512);
    const LinearIn rows = round_bf16 ? LinearIn{nullptr, reinterpret_cast<const uint16_t*>(xc.const_data_ptr())}
                                     : LinearIn{xc.const_data_ptr<float>(), nullptr};
    const at::Tensor laid = at::empty({M, K}, xc.options().dtype(at::kFloat));  // as the tiles read x, once
    (wide ? &avx512::linear_group_rows : &avx2::linear_group_rows)(rows, K, 0, M, laid.data_ptr<float>());
    const float* xp = laid.const_data_ptr<float>();
    const uint32_t* wp = reinterpret_cast<const uint32_t*>(packed.const_data_ptr());
    parallel_runs(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b0 = p * kPartBlocks, b1 = std::min(blocks, b0 + kPartBlocks);
        if (wide) {
          avx512::linear_argmax_part(xp, M, K, wp, b0, b1, round_bf16, &best[p * M], &best_id[p * M]);
        } else {
          avx2::linear_argmax_part(xp, M, K, wp, b0, b1, round_bf16, &best[p * M], &best_id[p * M]);
        }
      }
    });
  }
  int64_t* op = out.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {
    float top = best[m];
    int64_t id = best_id[m];
    for (int64_t p = 1; p < parts; ++p)
      if (best[p * M + m] > top) top = best[p * M + m], id = best_id[p * M + m];
    op[m] = id;
  }
  return out;
}

}  // namespace folovllm::cpu
