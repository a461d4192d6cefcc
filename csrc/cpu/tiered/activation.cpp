// SiLU-and-mul, built once per tier (csrc/cpu/vec.h): out = silu(gate) * up for each row of a merged
// [gate | up] projection. bf16 rounds where the torch sequence it replaces does (silu's own result, then
// the product), so it matches F.silu(gate) * up up to exp's last ulp; a row's tail (width % kLanes) runs
// through a padded vector, so every element takes the same path.
#include "../tiered.h"
#include "../vec.h"

#include <algorithm>
#include <cstdint>

namespace folovllm::cpu::FOLO_TIER {
namespace {

FOLO_VINLINE Vec silu(Vec g) { return vdiv(g, vadd(vset1(1.0f), vexp(vmul(g, vset1(-1.0f))))); }

FOLO_VINLINE Vec load(const float* p) { return vload(p); }
FOLO_VINLINE Vec load(const uint16_t* p) { return vload_bf16(p); }
FOLO_VINLINE void store(float* p, Vec v) { vstore(p, v); }
FOLO_VINLINE void store(uint16_t* p, Vec v) { vstore_bf16(p, v); }
template <typename T>
FOLO_VINLINE Vec as_stored(Vec v) {  // the value an op's T result holds
  if constexpr (sizeof(T) == 2) return vround_bf16(v);
  return v;
}

template <typename T>
void rows(const T* in, T* out, int64_t begin, int64_t end, int64_t width) {
  for (int64_t r = begin; r < end; ++r) {
    const T* gate = in + r * 2 * width;
    const T* up = gate + width;
    T* dst = out + r * width;
    int64_t d = 0;
    for (; d + kLanes <= width; d += kLanes) store(dst + d, vmul(as_stored<T>(silu(load(gate + d))), load(up + d)));
    if (d == width) continue;
    T g[kLanes] = {}, u[kLanes] = {}, o[kLanes];
    std::copy(gate + d, gate + width, g);
    std::copy(up + d, up + width, u);
    store(o, vmul(as_stored<T>(silu(load(g))), load(u)));
    std::copy(o, o + (width - d), dst + d);
  }
}

}  // namespace

void silu_mul_rows(const float* in, float* out, int64_t begin, int64_t end, int64_t width) {
  rows(in, out, begin, end, width);
}
void silu_mul_rows(const uint16_t* in, uint16_t* out, int64_t begin, int64_t end, int64_t width) {
  rows(in, out, begin, end, width);
}

}  // namespace folovllm::cpu::FOLO_TIER
