// Tessera tt-metal emulator (API pinned to tt-metal v0.62.2, 2025-08-20): compute_kernel_api/transpose_wh.h
// Same declarations as the stub tree, implemented over tt_emu runtime calls (a tile transposed into DST).
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
