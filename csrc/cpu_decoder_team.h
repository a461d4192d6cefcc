// The layer chain's team (csrc/cpu_decoder_chain.cpp): a small decode step of an int4 model run by one
// team of threads that stays together for the whole step.
//
// At one token every int4 matmul is a few microseconds: 173-924 KiB of codes, and each call through the
// op pays a dispatch, an output allocation and a parallel region's start and end, and it starts with its
// weights cold, so memory idles while the threads meet. In the team the threads split each matmul's
// column blocks between them and meet at a spinning barrier instead; the small ops between matmuls
// (norms, rotary and attention, SiLU-mul) run on the first thread, through their ops as before, while
// the others prefetch their share of the next matmul's codes into L2. Every output column is computed
// by the same kernel code (cpu_quant_int4.h's gemm_blocks) in the same order as the op, so the outputs
// are the op's bits, however the columns are split.
#pragma once

#include "cpu_quant_int4.h"

#include <atomic>

namespace {

// A barrier for the team. A phase of a one-token step is microseconds long, so a waiting thread spins,
// and while it waits it calls idle() until idle() says there is nothing more to do. One that has waited
// long (its partner lost its core to other work on a busy machine) sleeps until the last one arrives.
class SpinBarrier {
 public:
  explicit SpinBarrier(int threads) : threads_(threads) {}

  template <typename Idle>
  void wait(Idle&& idle) {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      generation_.notify_all();
      return;
    }
    bool busy = true;
    for (int64_t spins = 0; generation_.load(std::memory_order_acquire) == generation;) {
      if (busy) {
        busy = idle();
      } else if (++spins < kSpinsBeforeSleep) {
        _mm_pause();
      } else {
        generation_.wait(generation, std::memory_order_acquire);
      }
    }
  }

 private:
  static constexpr int64_t kSpinsBeforeSleep = 1 << 10;  // ~10-20 microseconds of pauses
  const int threads_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<int> generation_{0};
};

// Prefetches [next, end) into L2 a few lines per call: a waiting thread's idle work.
struct SlicePrefetch {
  const char* next = nullptr;
  const char* end = nullptr;

  bool operator()() {
    for (int i = 0; i < 8 && next < end; ++i, next += 64) _mm_prefetch(next, _MM_HINT_T1);
    return next < end;
  }
};

// One int4 linear as the op int4_gemm takes it (cpu_quant.pack_int4's layout), split by column blocks;
// perm: int4_gemm_perm's permutation of x's columns (act-order), or undefined.
struct Int4Weight {
  at::Tensor codes, scales, zeros;
  int64_t group_size = 0;
  at::Tensor perm;

  // x [M, K]'s columns in perm's order into `out` (int4_gemm_perm's index_select); x itself without perm.
  const c10::BFloat16* permuted(const c10::BFloat16* x, int64_t M, std::vector<c10::BFloat16>& out) const {
    if (!perm.defined()) return x;
    const int64_t k = K();
    const int64_t* order = perm.const_data_ptr<int64_t>();
    out.resize(M * k);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < k; ++j) out[m * k + j] = x[m * k + order[j]];
    return out.data();
  }

  int64_t K() const { return codes.size(1) * kChunkK; }
  int64_t N() const { return codes.size(0) * kBlockCols; }
  int64_t groups() const { return num_groups(K(), group_size); }
  const uint32_t* code_words() const { return reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>()); }

  // Thread t of `threads`: its column blocks [b0, b1), in pairs as gemm_blocks walks them.
  std::pair<int64_t, int64_t> blocks_of(int t, int threads) const {
    const int64_t blocks = codes.size(0), pairs = (blocks + kColBlocks - 1) / kColBlocks;
    const int64_t p0 = pairs * t / threads, p1 = pairs * (t + 1) / threads;
    return {std::min(blocks, p0 * kColBlocks), std::min(blocks, p1 * kColBlocks)};
  }

  // Thread t's codes, for its prefetch while it waits.
  SlicePrefetch slice_of(int t, int threads) const {
    const auto [b0, b1] = blocks_of(t, threads);
    const int64_t block_words = (K() / kChunkK) * kBlockCols;
    const char* base = reinterpret_cast<const char*>(code_words());
    return {base + b0 * block_words * 4, base + b1 * block_words * 4};
  }

  // Thread t's columns of y [M, N] = x [M, K] W^T, bf16 in and out; xsum: x's group sums (group_sums).
  void run(const c10::BFloat16* x, int64_t M, const float* xsum, c10::BFloat16* y, int t, int threads) const {
    const auto [b0, b1] = blocks_of(t, threads);
    if (b0 >= b1) return;
    if (scales.scalar_type() == at::kBFloat16) {
      gemm_blocks(x, M, K(), xsum, groups(), code_words(), scales.const_data_ptr<c10::BFloat16>(),
                  zeros.const_data_ptr<c10::BFloat16>(), group_size, y, N(), b0, b1);
    } else {
      gemm_blocks(x, M, K(), xsum, groups(), code_words(), scales.const_data_ptr<float>(),
                  zeros.const_data_ptr<float>(), group_size, y, N(), b0, b1);
    }
  }
};

}  // namespace
