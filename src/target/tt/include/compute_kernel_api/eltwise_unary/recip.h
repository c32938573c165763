// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/recip.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// The element-wise reciprocal 1 / x of a DST tile, on the SFPU (in float32).
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void recip_tile_init() { tt_emu::sfpu_init(tt_emu::SFPU_RECIP, "recip_tile_init"); }
ALWI void recip_tile(std::uint32_t idst) { tt_emu::sfpu_apply(tt_emu::SFPU_RECIP, idst, 1.0f, "recip_tile"); }

}  // namespace ckernel
