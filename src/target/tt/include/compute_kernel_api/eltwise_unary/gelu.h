// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/gelu.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

// fast_and_approx = true: tanh form 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
// fast_and_approx = false: erf form 0.5x(1 + erf(x / sqrt(2))). Both in float32.
template <bool fast_and_approx = true>
ALWI void gelu_tile_init() {
    tt_emu::sfpu_init(fast_and_approx ? tt_emu::SFPU_GELU_APPROX : tt_emu::SFPU_GELU, "gelu_tile_init");
}

template <bool fast_and_approx = true>
ALWI void gelu_tile(std::uint32_t idst) {
    tt_emu::sfpu_apply(fast_and_approx ? tt_emu::SFPU_GELU_APPROX : tt_emu::SFPU_GELU, idst, 1.0f, "gelu_tile");
}

}  // namespace ckernel
