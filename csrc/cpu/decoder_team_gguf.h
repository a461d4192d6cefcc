// gguf_gemm's weights (quant_gguf.h) on the layer chain's team (decoder_team.h): thread t of n takes its
// share of the weight's tasks (pairs of column blocks, across the parts in order) and computes them with
// the op's own loops, so the outputs are gguf_gemm's (or gguf_gemm_a8's) bits however the tasks are split.
#pragma once

#include "decoder_team.h"
#include "quant_gguf_a8.h"

namespace folovllm::cpu {
namespace {

struct GgufLinear final : TeamLinear {
  at::Tensor weight, parts;
  GgufWeight w;
  int64_t a8_rows;  // gguf_gemm_a8's: Q4_K and Q6_K parts with int8 activations from this many rows (0: never)

  GgufLinear(at::Tensor weight, at::Tensor parts, int64_t a8_rows)
      : weight(std::move(weight)), parts(std::move(parts)), w(gguf_weight(this->weight, this->parts)),
        a8_rows(a8_rows) {}

  int64_t N() const override { return w.N; }

  // The bytes of tasks [t0, t1): contiguous, since the parts lie in order.
  SlicePrefetch slice_of(int t, int threads) const override {
    const auto [t0, t1] = share_of(w.tasks(), 1, t, threads);
    SlicePrefetch slice;
    gguf_ranges(w, t0, t1, [&](const GgufPartView& part, int64_t b0, int64_t b1) {
      const char* first = reinterpret_cast<const char*>(part.data + b0 * part.block_bytes);
      if (slice.next == nullptr) slice.next = first;
      slice.end = reinterpret_cast<const char*>(part.data + b1 * part.block_bytes);
    });
    return slice;
  }

  void run(const c10::BFloat16* x, int64_t M, c10::BFloat16* y, int t, int threads,
           TeamScratch& scratch) const override {
    scratch.xsum.resize(M * (w.K / 16));
    group_sums(x, M, w.K, 16, scratch.xsum.data());
    GgufA8Rows xa{};
    if (a8_rows > 0 && gguf_a8_takes(w, M, a8_rows)) xa = gguf_a8_quantize(x, M, w.K, scratch.a8);  // each thread its own: a few us
    const auto [t0, t1] = share_of(w.tasks(), 1, t, threads);
    gguf_ranges(w, t0, t1, [&](const GgufPartView& part, int64_t b0, int64_t b1) {
      gguf_blocks_a8(part, b0, b1, x, xa.a != nullptr ? &xa : nullptr, M, w.K, scratch.xsum.data(), y, w.N);
    });
  }
};

}  // namespace
}  // namespace folovllm::cpu
