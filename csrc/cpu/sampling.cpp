// Sampling among each row's top k logits on CPU, registered as torch.ops.folovllm.*:
//   top_k_rows(logits [N, V] float32, k)  (values [N, k], ids [N, k] int64): each row's k largest values, highest
//                                         first; among equal values the lower id first (logits without NaN)
//   sample_top_k(logits, k, temperature, top_k, top_p?, min_p?, seed_keys?, counters?, seeded?, noise?)  int64 [N]:
//                                         each row's token, sampled among its k largest logits as the sampler's
//                                         torch form does it (sample/sampler.py: _sample_candidates)
//
// Finding the top k without branching on single logits: the k-th largest by bisection over order-preserving
// keys, each step a vectorized count, then the candidates at least as large, each placed by its rank among
// them (select_sorted). A large vocabulary (49,152 for SmolLM2, 151,936 for Qwen3) is
// streamed once first, with a threshold, the k-th largest value kept so far: a run of 32 logits is looked at
// only when one of them beats the threshold, which after the first few runs almost none does (the check is
// plain C++ the compiler vectorizes at any x86-64 level). Kept logits collect in a buffer; when it fills, the
// selection above keeps its best k and raises the threshold. A logit equal to the threshold is not kept: k
// logits of lower id already hold values at least as high.
//
// Sampling: temperature, the row's own top k, top-p and min-p on the k candidates, then the exponential race
// argmax(probs / noise), each in the torch form's order and precision (top-p's tail mass summed in double,
// as torch's cumsum does), so a row samples the torch form's token but where two candidates' scores differ by
// an ulp of exp or log. A seeded row's noise is hashed from (seed, output count, token id) as
// sample/seeded_noise.py does it; the other rows' comes in ``noise``, drawn by the caller as the torch form
// draws it.

#include "isa.h"
#include "ops.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace folovllm::cpu {
namespace {

constexpr int64_t kRun = 32;  // logits checked against the threshold at once

// A thread's buffers for rows of ``vocab`` logits and k candidates.
struct Scratch {
  std::vector<float> values;  // the large vocabulary's kept candidates and their ids
  std::vector<int32_t> ids;
  std::vector<int32_t> row_ids;  // 0, 1, ..., for a small vocabulary's row
  std::vector<uint32_t> keys;  // the candidates' order-preserving keys
  std::vector<float> gathered_values;  // the candidates at least as large as the threshold, and their ids
  std::vector<int32_t> gathered_ids;
  std::vector<float> sorted_values;  // the row's k best, highest first, and their ids
  std::vector<int64_t> sorted_ids;
  std::vector<float> work;  // 2k floats for the sampling steps
  int64_t room;  // candidates the large vocabulary's pass keeps before it selects among them
  Scratch(int64_t vocab, int64_t k) : room(std::max<int64_t>(4 * k, 512)) {
    const int64_t held = std::min(vocab, room + kRun);
    values.resize(held);
    ids.resize(held);
    row_ids.resize(held);
    for (int64_t i = 0; i < held; ++i) row_ids[i] = static_cast<int32_t>(i);
    keys.resize(held);
    gathered_values.resize(held);
    gathered_ids.resize(held);
    sorted_values.resize(k);
    sorted_ids.resize(k);
    work.resize(2 * k);
  }
};

// How many of v[0, n) come before (value, id) in the result's order: higher values, then equal ones of lower id.
FOLO_INLINE int32_t rank_of(const float* v, const int32_t* id, int64_t n, float value, int32_t at) {
  int32_t rank = 0;
  for (int64_t j = 0; j < n; ++j) rank += (v[j] > value) | ((v[j] == value) & (id[j] < at));
  return rank;
}

// An unsigned key in the order of the float (no NaN; -0 made +0 first, so the two tie as floats do).
FOLO_INLINE uint32_t order_key(float x) {
  const float canonical = x + 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &canonical, sizeof bits);
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

FOLO_INLINE int32_t count_at_least(const uint32_t* keys, int64_t n, uint32_t t) {
  int32_t count = 0;
  for (int64_t j = 0; j < n; ++j) count += keys[j] >= t;
  return count;
}

// The k best of n candidates (values, ids) by (value, then lower id), written highest first to sorted_*.
// The k-th largest value by bisection over order-preserving keys, each step a count that vectorizes; the
// candidates at least as large gathered; each placed by its rank among them. Nothing branches on single
// logits (a sort or nth_element mispredicts about every other comparison: most of their time here).
FOLO_INLINE void select_sorted_at(const float* values, const int32_t* ids, int64_t n, int64_t k, Scratch& s) {
  uint32_t* keys = s.keys.data();
  uint32_t lo = 0xFFFFFFFFu, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = order_key(values[i]);
    lo = std::min(lo, keys[i]);
    hi = std::max(hi, keys[i]);
  }
  while (lo < hi) {  // the largest key t with at least k keys >= t
    const uint32_t mid = lo + (hi - lo) / 2 + 1;
    if (count_at_least(keys, n, mid) >= k) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  float* v = s.gathered_values.data();
  int32_t* id = s.gathered_ids.data();
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    v[m] = values[i];
    id[m] = ids[i];
    m += keys[i] >= lo;
  }
  for (int64_t i = 0; i < m; ++i) {
    const int32_t rank = rank_of(v, id, m, v[i], id[i]);
    if (rank < k) {
      s.sorted_values[rank] = v[i];
      s.sorted_ids[rank] = id[i];
    }
  }
}

// select_sorted_at compiled for each x86-64 level (its comparisons vectorize 4, 8 or 16 wide), run at the tier's.
FOLO_TARGET_V4 void select_sorted_v4(const float* values, const int32_t* ids, int64_t n, int64_t k, Scratch& s) {
  select_sorted_at(values, ids, n, k, s);
}
FOLO_TARGET_V3 void select_sorted_v3(const float* values, const int32_t* ids, int64_t n, int64_t k, Scratch& s) {
  select_sorted_at(values, ids, n, k, s);
}
void select_sorted(const float* values, const int32_t* ids, int64_t n, int64_t k, Scratch& s) {
  if (tier_at_least(Tier::kAvx512)) return select_sorted_v4(values, ids, n, k, s);
  if (tier_at_least(Tier::kAvx2)) return select_sorted_v3(values, ids, n, k, s);
  select_sorted_at(values, ids, n, k, s);
}

// A small vocabulary's row: every logit a candidate.
void top_k_small(const float* row, int64_t vocab, int64_t k, Scratch& s) {
  select_sorted(row, s.row_ids.data(), vocab, k, s);
}

// A large vocabulary's row: one streaming pass with a rising threshold keeps candidates, selected among
// whenever they fill the buffer and at the end.
void top_k_large(const float* row, int64_t vocab, int64_t k, Scratch& s) {
  float* values = s.values.data();
  int32_t* ids = s.ids.data();
  float threshold = row[0];
  for (int64_t i = 0; i < k; ++i) {
    values[i] = row[i];
    ids[i] = static_cast<int32_t>(i);
    threshold = std::min(threshold, row[i]);
  }
  int64_t n = k, i = k;
  for (; i + kRun <= vocab; i += kRun) {
    int hits = 0;  // an OR of comparisons: vectorized, unlike a float max
    for (int64_t j = 0; j < kRun; ++j) hits |= row[i + j] > threshold;
    if (!hits) continue;
    for (int64_t j = 0; j < kRun; ++j) {
      values[n] = row[i + j];
      ids[n] = static_cast<int32_t>(i + j);
      n += row[i + j] > threshold;
    }
    if (n >= s.room) {
      select_sorted(values, ids, n, k, s);
      std::copy(s.sorted_values.begin(), s.sorted_values.end(), values);
      std::copy(s.sorted_ids.begin(), s.sorted_ids.end(), ids);
      threshold = values[k - 1];
      n = k;
    }
  }
  for (; i < vocab; ++i) {
    values[n] = row[i];
    ids[n] = static_cast<int32_t>(i);
    n += row[i] > threshold;
  }
  select_sorted(values, ids, n, k, s);
}

// A row's k best logits in s.sorted_values / s.sorted_ids, highest first.
void top_k_row(const float* row, int64_t vocab, int64_t k, Scratch& s) {
  if (vocab <= s.room + kRun) {
    top_k_small(row, vocab, k, s);
  } else {
    top_k_large(row, vocab, k, s);
  }
}

void check_logits(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                  logits.device().is_cpu(), "logits must be a contiguous float32 CPU tensor [N, V]");
  TORCH_CHECK(k >= 1 && k <= logits.size(1), "k must be in [1, V=", logits.size(1), "], got ", k);
}

// Rows of ~16k logits per task.
int64_t row_grain(int64_t vocab) { return std::max<int64_t>(1, (1 << 14) / vocab); }

// sample/seeded_noise.py's hash, on 32-bit values in 64-bit integers as there.
constexpr uint64_t kLow32 = 0xFFFFFFFFull, kMultiplier = 0x45D9F3Bull, kGolden = 0x9E3779B1ull;
inline uint64_t mix(uint64_t x) {
  x = (((x >> 16) ^ x) * kMultiplier) & kLow32;
  x = (((x >> 16) ^ x) * kMultiplier) & kLow32;
  return (x >> 16) ^ x;
}

// Exp(1) noise for token ``id`` of a row keyed by ``row_key``, as seeded_exponential computes it.
inline float seeded_noise(uint64_t row_key, int64_t id) {
  const uint64_t bits = mix(row_key ^ ((static_cast<uint64_t>(id) * kGolden) & kLow32));
  const float uniform = (static_cast<float>(bits >> 8) + 0.5f) * 0x1p-24f;
  return -std::log(uniform);
}

// vals[0, n) := softmax(vals[0, n)), highest value first in vals (vals[0] is the max, finite).
void softmax_sorted(float* vals, int64_t n) {
  const float top = vals[0];
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    vals[j] = std::exp(vals[j] - top);
    sum += vals[j];
  }
  for (int64_t j = 0; j < n; ++j) vals[j] /= sum;
}

// Optional per-row inputs of sample_top_k.
struct RowSettings {
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;  // null: no row has one
  const float* min_p;
  const int64_t* seed_keys;  // null: no row is seeded
  const int64_t* counters;
  const bool* seeded;
  const float* noise;  // [N, k], the unseeded rows' noise; null: every row is seeded
};

// Row r's token among its k candidates (values highest first, and their ids); ``vals``: 2k floats of room.
int64_t sample_row(const float* top, const int64_t* top_ids, int64_t k, int64_t r, const RowSettings& rs,
                   float* vals) {
  const float temperature = rs.temperature[r];
  const int64_t row_k = std::min(rs.top_k[r], k);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < k; ++j) vals[j] = j < row_k ? top[j] / temperature : neg_inf;
  if (rs.top_p != nullptr) {
    // drop the low tail whose mass (the token's own included) is at most 1 - p; the top token stays
    float* probs = vals + k;
    std::copy(vals, vals + k, probs);
    softmax_sorted(probs, k);
    const float limit = 1.0f - rs.top_p[r];
    double tail = 0.0;
    for (int64_t j = k - 1; j >= 1; --j) {
      tail += probs[j];
      if (static_cast<float>(tail) <= limit) vals[j] = neg_inf;
    }
  }
  if (rs.min_p != nullptr) {
    const float threshold = vals[0] + std::log(rs.min_p[r]);
    for (int64_t j = 0; j < k; ++j)
      if (vals[j] < threshold) vals[j] = neg_inf;
  }
  softmax_sorted(vals, k);
  const bool hashed = rs.seed_keys != nullptr && (rs.seeded == nullptr || rs.seeded[r]);
  const uint64_t row_key = hashed ? mix(mix(static_cast<uint64_t>(rs.seed_keys[r]) & kLow32) ^
                                        (static_cast<uint64_t>(rs.counters[r]) & kLow32))
                                  : 0;
  int64_t best = 0;
  float best_score = neg_inf;
  for (int64_t j = 0; j < k; ++j) {
    const float noise = hashed ? seeded_noise(row_key, top_ids[j]) : rs.noise[r * k + j];
    const float score = vals[j] / noise;
    if (score > best_score) {
      best_score = score;
      best = j;
    }
  }
  return top_ids[best];
}

template <typename T>
const T* optional_ptr(const c10::optional<at::Tensor>& t, int64_t rows, at::ScalarType dtype, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == dtype && t->is_contiguous() && t->numel() == rows, name,
              " must be a contiguous [N] tensor of ", c10::toString(dtype));
  return t->const_data_ptr<T>();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> top_k_rows(const at::Tensor& logits, int64_t k) {
  check_logits(logits, k);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor values = at::empty({rows, k}, logits.options());
  at::Tensor ids = at::empty({rows, k}, logits.options().dtype(at::kLong));
  const float* in = logits.const_data_ptr<float>();
  float* out_values = values.mutable_data_ptr<float>();
  int64_t* out_ids = ids.mutable_data_ptr<int64_t>();
  at::parallel_for(0, rows, row_grain(vocab), [&](int64_t begin, int64_t end) {
    Scratch scratch(vocab, k);
    for (int64_t r = begin; r < end; ++r) {
      top_k_row(in + r * vocab, vocab, k, scratch);
      for (int64_t j = 0; j < k; ++j) {
        out_values[r * k + j] = scratch.sorted_values[j];
        out_ids[r * k + j] = scratch.sorted_ids[j];
      }
    }
  });
  return {values, ids};
}

at::Tensor sample_top_k(const at::Tensor& logits, int64_t k, const at::Tensor& temperature, const at::Tensor& top_k,
                        const c10::optional<at::Tensor>& top_p, const c10::optional<at::Tensor>& min_p,
                        const c10::optional<at::Tensor>& seed_keys, const c10::optional<at::Tensor>& counters,
                        const c10::optional<at::Tensor>& seeded, const c10::optional<at::Tensor>& noise) {
  check_logits(logits, k);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const RowSettings rs{optional_ptr<float>(temperature, rows, at::kFloat, "temperature"),
                       optional_ptr<int64_t>(top_k, rows, at::kLong, "top_k"),
                       optional_ptr<float>(top_p, rows, at::kFloat, "top_p"),
                       optional_ptr<float>(min_p, rows, at::kFloat, "min_p"),
                       optional_ptr<int64_t>(seed_keys, rows, at::kLong, "seed_keys"),
                       optional_ptr<int64_t>(counters, rows, at::kLong, "counters"),
                       optional_ptr<bool>(seeded, rows, at::kBool, "seeded"),
                       noise.has_value() ? noise->const_data_ptr<float>() : nullptr};
  TORCH_CHECK((rs.seed_keys == nullptr) == (rs.counters == nullptr), "seed_keys and counters come together");
  TORCH_CHECK(rs.seeded == nullptr || rs.seed_keys != nullptr, "seeded needs seed_keys");
  TORCH_CHECK(!noise.has_value() || (noise->scalar_type() == at::kFloat && noise->is_contiguous() &&
                                     noise->dim() == 2 && noise->size(0) == rows && noise->size(1) == k),
              "noise must be a contiguous float32 [N, k] tensor");
  TORCH_CHECK(rs.noise != nullptr || (rs.seed_keys != nullptr && rs.seeded == nullptr),
              "rows without a seed need noise");
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* in = logits.const_data_ptr<float>();
  int64_t* out = tokens.mutable_data_ptr<int64_t>();
  at::parallel_for(0, rows, row_grain(vocab), [&](int64_t begin, int64_t end) {
    Scratch scratch(vocab, k);
    for (int64_t r = begin; r < end; ++r) {
      top_k_row(in + r * vocab, vocab, k, scratch);
      out[r] = sample_row(scratch.sorted_values.data(), scratch.sorted_ids.data(), k, r, rs, scratch.work.data());
    }
  });
  return tokens;
}

}  // namespace folovllm::cpu
