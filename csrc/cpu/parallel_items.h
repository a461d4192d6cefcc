// Work items spread over torch's intra-op threads: claimed as the threads go (ItemClaims, tiered.h) where the
// linear_claims switch is on (isa.h), else each thread's fixed share, as at::parallel_for splits them. Items
// compute the same whichever thread runs them, so the switch never changes a result.
#pragma once

#include "isa.h"
#include "tiered.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace folovllm::cpu {

// fn(claims) once on each thread (at most n of them), the threads sharing items [0, n); `grain`: the fewest
// items of a fixed share (the switch off).
template <typename Fn>
void parallel_items(int64_t n, Fn&& fn, int64_t grain = 1) {
  if (n <= 0) return;
  if (!kernel_switches().linear_claims) {
    at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
      ItemClaims claims{.begin = b, .end = e};
      fn(claims);
    });
    return;
  }
  int64_t next = 0;
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    ItemClaims claims{.next = &next, .n = n, .threads = threads};
    fn(claims);
  });
}

// fn(i0, i1) for each run of items [i0, i1) that a thread claims.
template <typename Fn>
void parallel_runs(int64_t n, Fn&& fn, int64_t grain = 1) {
  parallel_items(
      n, [&](ItemClaims& claims) {
        for (int64_t b, e; claims.claim(&b, &e);) fn(b, e);
      },
      grain);
}

}  // namespace folovllm::cpu
