// The tile unit (AMX) as our kernels' AMX forms use it (linear_amx.h, attention_prefill_amx.h): whether it runs
// here, and the one tile layout every form loads, eight tiles of 16 rows x 64 bytes. By convention tiles 0-3
// hold fp32 sums (C: 16 rows x 16 fp32), 4-5 the left operand (A: 16 rows x 32 bf16) and 6-7 the right one
// (B: 16 pairs of rows x 16 columns x 2 bf16); TDPBF16PS adds A B into C.
#pragma once

#include "isa.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace folovllm::cpu {
namespace {

// Linux hands a process the tile registers' state only once asked (arch_prctl ARCH_REQ_XCOMP_PERM); false
// where the kernel refuses, and then no AMX form runs.
inline bool amx_permitted() {
  static const bool permitted = [] {
    constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

// Whether the AMX forms run here: the amx tier, and the tile state granted.
inline bool amx_runs() { return tier_at_least(Tier::kAmx) && amx_permitted(); }

// The layout as LDTILECFG reads it: palette 1, tiles 0-7 of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Loads the layout on this thread (tile state is per thread; amx_release() gives it back). The layout is a
// constant in memory: gcc may drop stores to a local that only LDTILECFG reads (it did here, leaving every
// tile unconfigured).
FOLO_TARGET_AMX inline void amx_configure() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

FOLO_TARGET_AMX inline void amx_release() { _tile_release(); }

FOLO_TARGET_AMX FOLO_INLINE void zero_c_tiles() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

}  // namespace
}  // namespace folovllm::cpu
