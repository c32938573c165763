// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): compute_kernel_api/binary_max_min.h
// Same declarations as the stub tree, implemented over tt_emu runtime calls (max of two DST tiles, in float32).
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void binary_max_tile_init() { tt_emu::sfpu_init(tt_emu::SFPU_MAX, "binary_max_tile_init"); }
ALWI void binary_max_tile(std::uint32_t idst0, std::uint32_t idst1) {
    tt_emu::sfpu_binary(tt_emu::SFPU_MAX, idst0, idst1, "binary_max_tile");
}

}  // namespace ckernel
