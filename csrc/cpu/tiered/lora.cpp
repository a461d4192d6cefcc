// The adapters' deltas of one LoRA-wrapped linear, built once per tier (csrc/cpu/vec.h; the op is
// csrc/cpu/lora.cpp). For each row n whose slot s is not -1: xa = A_s x[n] (A_s: the slot's rows of A,
// fp32), then for each of the slot's pieces, out[n, lo:hi] += sum_k xa[k] Bt[k, :] (Bt: the piece's B
// transposed, scale folded in). Sums run in fp32 and a bf16 output is rounded once, after all of a row's
// terms: the exact multiplications of the segmented form, none of a stacked form's wasted ones. Rows of
// one slot go in blocks of up to kRowBlock, so each A and B vector is loaded once per block, not per row.
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>

namespace folovllm::cpu::FOLO_TIER {
namespace {

FOLO_VINLINE Vec load(const float* p) { return vload(p); }
FOLO_VINLINE Vec load(const uint16_t* p) { return vload_bf16(p); }
FOLO_VINLINE void store(float* p, Vec v) { vstore(p, v); }
FOLO_VINLINE void store(uint16_t* p, Vec v) { vstore_bf16(p, v); }

FOLO_VINLINE float widen(float v) { return v; }
FOLO_VINLINE float widen(uint16_t v) { return bf16_scalar(v); }

constexpr int kRowBlock = kLoraRowBlock;

// xa[i * xa_stride + k - k0] = A[k] . x[i] for A's rows k0..k1 (length n) and the M fp32 rows x (stride n).
template <int M>
void project(const float* a, int64_t k0, int64_t k1, int64_t n, const float* x, float* xa, int64_t xa_stride) {
  const int64_t full = n - n % kLanes;
  for (int64_t k = k0; k < k1; ++k) {
    const float* row = a + k * n;
    Vec s[M];
    for (int i = 0; i < M; ++i) s[i] = vzero();
    for (int64_t d = 0; d < full; d += kLanes) {
      const Vec av = vload(row + d);
      for (int i = 0; i < M; ++i) s[i] = vfma(av, vload(x + i * n + d), s[i]);
    }
    for (int i = 0; i < M; ++i) {
      float sum = vhsum(s[i]);
      for (int64_t d = full; d < n; ++d) sum += row[d] * x[i * n + d];
      xa[i * xa_stride + (k - k0)] = sum;
    }
  }
}

constexpr int64_t kBTile = 8;  // rows of Bt read side by side: few enough streams for the prefetchers

// acc[i][d] (+)= sum_j xa[i * xa_stride + j] bt[j * width + d] over j in [0, rank) for d in whole vectors
// [0, full), M rows of acc (stride acc_stride, T or fp32), each B vector loaded once for the M rows.
template <int M, typename A>
FOLO_VINLINE void accumulate(A* acc, int64_t acc_stride, int64_t full, const float* xa, int64_t xa_stride,
                             const float* bt, int64_t rank, int64_t width) {
  for (int64_t d = 0; d < full; d += kLanes) {
    Vec v[M];
    for (int i = 0; i < M; ++i) v[i] = load(acc + i * acc_stride + d);
    for (int64_t j = 0; j < rank; ++j) {
      const Vec bv = vload(bt + j * width + d);
      for (int i = 0; i < M; ++i) v[i] = vfma(vbroadcast(xa + i * xa_stride + j), bv, v[i]);
    }
    for (int i = 0; i < M; ++i) store(acc + i * acc_stride + d, v[i]);
  }
}

// out row i [0..width) += sum_j xa[i * xa_stride + j] bt[j * width + ...] over j in [0, rank), for M rows
// (stride out_stride): fp32 sums, T's rounding once. Up to kBTile rows of Bt go straight into the output;
// a higher rank sums into fp32 rows of ws (M x width) kBTile rows of Bt at a time, so Bt streams from memory
// in order rather than as `rank` strided streams.
template <int M, typename T>
void add_piece(T* out, int64_t out_stride, const float* xa, int64_t xa_stride, const float* bt, int64_t rank,
               int64_t width, float* ws) {
  const int64_t full = width - width % kLanes;
  if (rank <= kBTile) {
    accumulate<M>(out, out_stride, full, xa, xa_stride, bt, rank, width);
  } else {
    for (int i = 0; i < M; ++i) {
      for (int64_t d = 0; d < full; ++d) ws[i * width + d] = widen(out[i * out_stride + d]);
    }
    for (int64_t j0 = 0; j0 < rank; j0 += kBTile) {
      accumulate<M>(ws, width, full, xa + j0, xa_stride, bt + j0 * width, std::min(kBTile, rank - j0), width);
    }
    for (int i = 0; i < M; ++i) {
      for (int64_t d = 0; d < full; d += kLanes) store(out + i * out_stride + d, vload(ws + i * width + d));
    }
  }
  if (full == width) return;
  float b[kLanes] = {};
  for (int i = 0; i < M; ++i) {
    T o[kLanes] = {};
    std::copy(out + i * out_stride + full, out + i * out_stride + width, o);
    Vec acc = load(o);
    for (int64_t j = 0; j < rank; ++j) {
      std::copy(bt + j * width + full, bt + j * width + width, b);
      acc = vfma(vbroadcast(xa + i * xa_stride + j), vload(b), acc);
    }
    store(o, acc);
    std::copy(o, o + (width - full), out + i * out_stride + full);
  }
}

// M rows from row n on, all of slot s.
template <int M, typename T>
void block(const T* x, int64_t x_stride, T* out, int64_t out_stride, int64_t n, int64_t s, const LoraTables& t,
           float* ws) {
  const int64_t k0 = t.a_start[s], rank = t.a_start[s + 1] - k0;
  float* xf = ws;
  float* xa = ws + M * t.in;
  float* sums = xa + M * rank;
  for (int i = 0; i < M; ++i) {
    const T* xn = x + (n + i) * x_stride;
    for (int64_t d = 0; d < t.in; ++d) xf[i * t.in + d] = widen(xn[d]);
  }
  project<M>(t.a, k0, k0 + rank, t.in, xf, xa, rank);
  for (int64_t p = t.p_start[s]; p < t.p_start[s + 1]; ++p) {
    const int64_t* piece = t.pieces + 5 * p;  // A rows [kb, ke), outputs [lo, hi), Bt's offset in b
    add_piece<M>(out + n * out_stride + piece[2], out_stride, xa + (piece[0] - k0), rank, t.b + piece[4],
                 piece[1] - piece[0], piece[3] - piece[2], sums);
  }
}

template <typename T>
void rows(const T* x, int64_t x_stride, T* out, int64_t out_stride, const int64_t* row_slot, int64_t begin,
          int64_t end, const LoraTables& t, float* ws) {
  for (int64_t n = begin; n < end;) {
    const int64_t s = row_slot[n];
    int64_t m = 1;  // the run of rows of slot s from n, up to a block
    while (m < kRowBlock && n + m < end && row_slot[n + m] == s) ++m;
    if (s >= 0 && t.a_start[s] < t.a_start[s + 1]) {
      switch (m) {
        case 1: block<1>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 2: block<2>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 3: block<3>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 4: block<4>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 5: block<5>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 6: block<6>(x, x_stride, out, out_stride, n, s, t, ws); break;
        case 7: block<7>(x, x_stride, out, out_stride, n, s, t, ws); break;
        default: block<8>(x, x_stride, out, out_stride, n, s, t, ws); break;
      }
    }
    n += m;
  }
}

}  // namespace

void lora_rows(const float* x, int64_t x_stride, float* out, int64_t out_stride, const int64_t* row_slot,
               int64_t begin, int64_t end, const LoraTables& tables, float* ws) {
  rows(x, x_stride, out, out_stride, row_slot, begin, end, tables, ws);
}
void lora_rows(const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride, const int64_t* row_slot,
               int64_t begin, int64_t end, const LoraTables& tables, float* ws) {
  rows(x, x_stride, out, out_stride, row_slot, begin, end, tables, ws);
}

}  // namespace folovllm::cpu::FOLO_TIER
