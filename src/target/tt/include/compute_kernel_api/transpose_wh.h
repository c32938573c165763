// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/transpose_wh.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// A tile transposed (B[w, h] = A[h, w]) on its way from a CB into DST.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

ALWI void transpose_wh_init(std::uint32_t icb, std::uint32_t ocb) {
    tt_emu::hw_startup("transpose_wh_init", icb, icb, ocb);
    tt_emu::fpu_init(tt_emu::FPU_TRANSPOSE, icb, icb, 0u, "transpose_wh_init");
}
ALWI void transpose_wh_init_short(std::uint32_t icb) {
    tt_emu::fpu_init(tt_emu::FPU_TRANSPOSE, icb, icb, 0u, "transpose_wh_init_short");
}
ALWI void transpose_wh_tile(std::uint32_t icb, std::uint32_t itile, std::uint32_t idst) {
    tt_emu::transpose_tile(icb, itile, idst);
}

}  // namespace ckernel
