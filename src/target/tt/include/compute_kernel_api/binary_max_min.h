// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/binary_max_min.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// The element-wise maximum of two DST tiles on the SFPU (in float32); the result overwrites the first operand.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void binary_max_tile_init() { tt_emu::sfpu_init(tt_emu::SFPU_MAX, "binary_max_tile_init"); }
ALWI void binary_max_tile(std::uint32_t idst0, std::uint32_t idst1) {
    tt_emu::sfpu_binary(tt_emu::SFPU_MAX, idst0, idst1, "binary_max_tile");
}

}  // namespace ckernel
