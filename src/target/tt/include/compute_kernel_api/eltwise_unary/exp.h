// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/exp.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include <cstring>

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

template <bool approx = false, bool fast_and_approx = true, std::uint32_t scale = 0x3F800000>
ALWI void exp_tile_init() {
    tt_emu::sfpu_init(tt_emu::SFPU_EXP, "exp_tile_init");
}

// Computed as exp(x * scale) in float32 whatever the approximation flags ask for.
template <bool approx = false, bool fast_and_approx = true, bool scale_en = false, bool skip_positive_check = false,
          int iterations = 8>
ALWI void exp_tile(std::uint32_t idst, int vector_mode = (int)VectorMode::RC, std::uint16_t scale = p_sfpu::kCONST_1_FP16B) {
    if (vector_mode != (int)VectorMode::RC) {
        tt_emu::unsupported("exp_tile with a vector_mode other than VectorMode::RC");
    }
    float factor = 1.0f;
    if (scale_en) {
        const std::uint32_t bits = static_cast<std::uint32_t>(scale) << 16;
        std::memcpy(&factor, &bits, sizeof(factor));
    }
    tt_emu::sfpu_apply(tt_emu::SFPU_EXP, idst, factor, "exp_tile");
}

}  // namespace ckernel
