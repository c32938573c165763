// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/relu.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void relu_tile_init() { tt_emu::sfpu_init(tt_emu::SFPU_RELU, "relu_tile_init"); }
ALWI void relu_tile(std::uint32_t idst) { tt_emu::sfpu_apply(tt_emu::SFPU_RELU, idst, 1.0f, "relu_tile"); }

}  // namespace ckernel
