// The layer chain's team (decoder_chain.cpp): a small decode step run by one team of threads that
// stays together for the whole step.
//
// At one token every matmul is a few microseconds (173-924 KiB of int4 codes per linear of the default
// model, 0.7-3.5 MiB in bf16), and each call through the op pays a dispatch, an output allocation and a
// parallel region's start and end, and it starts with its weights cold, so memory idles while the
// threads meet. In the team the threads split each matmul's column blocks between them and meet at a
// spinning barrier instead; the small ops between matmuls (norms, rotary and attention, SiLU-mul) run on
// the first thread, through their ops as before, while the others prefetch their share of the next
// matmul's weights into L2. Every output column is computed
// by the same kernel code as the op (quant_int4.h's gemm_blocks, linear_bf16.h's
// linear_items) in the same order, so the outputs are the op's bits, however the columns are split.
#pragma once

#include "linear_bf16.h"
#include "quant_int4.h"

#include <atomic>

namespace folovllm::cpu {
namespace {

// A barrier for the team. A phase of a one-token step is microseconds long, so a waiting thread spins,
// and while it waits it calls idle() until idle() says there is nothing more to do. One that has waited
// long (its partner lost its core to other work on a busy machine) sleeps until the last one arrives.
// stop() (a thread whose op failed, before it arrives) makes this wait return true for every thread, and
// only this one: the last to arrive latches it before it releases the others.
class SpinBarrier {
 public:
  explicit SpinBarrier(int threads) : threads_(threads) {}

  void stop() { stop_asked_.store(true, std::memory_order_relaxed); }

  template <typename Idle>
  bool wait(Idle&& idle) {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
      arrived_.store(0, std::memory_order_relaxed);
      stopping_ = stop_asked_.load(std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      generation_.notify_all();
      return stopping_;
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
    return stopping_;  // written before the release this thread saw, and not again until it arrives next
  }

 private:
  static constexpr int64_t kSpinsBeforeSleep = 1 << 10;  // ~10-20 microseconds of pauses
  const int threads_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<int> generation_{0};
  std::atomic<bool> stop_asked_{false};
  bool stopping_ = false;
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

// What one thread needs for its share of a matmul besides the weight: the int4 kernel's group sums of x,
// act-order's gathered x and gguf_gemm_a8's rounded x.
struct TeamScratch {
  std::vector<float> xsum;
  A8Buffers a8;  // gguf_gemm_a8's x rounded to int8
  std::vector<c10::BFloat16> gathered;
};

// A linear the team splits by output columns: thread t of n computes its columns with the op's own kernel
// code (so the same bits), and prefetches its share of the weight while it waits.
struct TeamLinear {
  virtual ~TeamLinear() = default;
  virtual int64_t N() const = 0;
  virtual SlicePrefetch slice_of(int t, int threads) const = 0;
  // Thread t's columns of y [M, N] = x [M, K] W^T, bf16 in and out.
  virtual void run(const c10::BFloat16* x, int64_t M, c10::BFloat16* y, int t, int threads,
                   TeamScratch& scratch) const = 0;
};

// [first, last) of `count` items for thread t of n, in runs of `step` items.
inline std::pair<int64_t, int64_t> share_of(int64_t count, int64_t step, int t, int threads) {
  const int64_t runs = (count + step - 1) / step;
  return {std::min(count, runs * t / threads * step), std::min(count, runs * (t + 1) / threads * step)};
}

// int4_gemm's weight (cpu_int4.pack_int4's layout); perm: int4_gemm_perm's permutation of x's columns
// (act-order), or undefined. Threads split the 16-column blocks in pairs, as gemm_blocks walks them.
struct Int4Linear final : TeamLinear {
  at::Tensor codes, scales, zeros;
  int64_t group_size = 0;
  at::Tensor perm;

  Int4Linear(at::Tensor codes, at::Tensor scales, at::Tensor zeros, int64_t group_size, at::Tensor perm)
      : codes(std::move(codes)), scales(std::move(scales)), zeros(std::move(zeros)), group_size(group_size),
        perm(std::move(perm)) {
    if (this->perm.defined()) check_permutation(this->perm, K());
  }

  int64_t K() const { return codes.size(1) * kChunkK; }
  int64_t N() const override { return codes.size(0) * kBlockCols; }
  int64_t groups() const { return num_groups(K(), group_size); }
  const uint32_t* code_words() const { return reinterpret_cast<const uint32_t*>(codes.const_data_ptr<int32_t>()); }
  std::pair<int64_t, int64_t> blocks_of(int t, int threads) const {
    return share_of(codes.size(0), kColBlocks, t, threads);
  }

  SlicePrefetch slice_of(int t, int threads) const override {
    const auto [b0, b1] = blocks_of(t, threads);
    const int64_t block_bytes = (K() / kChunkK) * kBlockCols * 4;
    const char* base = reinterpret_cast<const char*>(code_words());
    return {base + b0 * block_bytes, base + b1 * block_bytes};
  }

  void run(const c10::BFloat16* x, int64_t M, c10::BFloat16* y, int t, int threads,
           TeamScratch& scratch) const override {
    const int64_t k = K();
    if (perm.defined()) {  // int4_gemm_perm's gather
      const int64_t* order = perm.const_data_ptr<int64_t>();
      scratch.gathered.resize(M * k);
      for (int64_t m = 0; m < M; ++m) gather_row(x + m * k, order, k, scratch.gathered.data() + m * k);
      x = scratch.gathered.data();
    }
    scratch.xsum.resize(M * groups());
    group_sums(x, M, k, group_size, scratch.xsum.data());
    const auto [b0, b1] = blocks_of(t, threads);
    if (b0 >= b1) return;
    if (scales.scalar_type() == at::kBFloat16) {
      gemm_blocks(x, M, k, scratch.xsum.data(), groups(), code_words(), scales.const_data_ptr<c10::BFloat16>(),
                  zeros.const_data_ptr<c10::BFloat16>(), group_size, y, N(), b0, b1);
    } else {
      gemm_blocks(x, M, k, scratch.xsum.data(), groups(), code_words(), scales.const_data_ptr<float>(),
                  zeros.const_data_ptr<float>(), group_size, y, N(), b0, b1);
    }
  }
};

// folovllm::linear's packed bf16 weight [N / 64, K / 2, 64, 2], no bias; threads split the
// 64-row blocks (one work item each for up to kChunkRows rows, as the op makes them).
struct Bf16Linear final : TeamLinear {
  at::Tensor packed;

  explicit Bf16Linear(at::Tensor packed) : packed(std::move(packed)) {}

  int64_t N() const override { return packed.size(0) * kBlockRows; }
  int64_t pairs() const { return packed.size(1); }
  const __m512bh* blocks() const { return reinterpret_cast<const __m512bh*>(packed.const_data_ptr<c10::BFloat16>()); }

  SlicePrefetch slice_of(int t, int threads) const override {
    const auto [b0, b1] = share_of(packed.size(0), 1, t, threads);
    const char* base = reinterpret_cast<const char*>(blocks());
    return {base + b0 * pairs() * 256, base + b1 * pairs() * 256};
  }

  void run(const c10::BFloat16* x, int64_t M, c10::BFloat16* y, int t, int threads, TeamScratch&) const override {
    const auto [b0, b1] = share_of(packed.size(0), 1, t, threads);
    if (b0 < b1) linear_items(reinterpret_cast<const uint32_t*>(x), M, pairs(), blocks(), nullptr, y, N(), b0, b1);
  }
};

}  // namespace
}  // namespace folovllm::cpu
