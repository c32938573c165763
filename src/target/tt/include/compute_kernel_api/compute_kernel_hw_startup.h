// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/compute_kernel_hw_startup.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void compute_kernel_hw_startup(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb) {
    tt_emu::hw_startup("compute_kernel_hw_startup", icb0, icb1, ocb);
}
ALWI void compute_kernel_hw_startup(std::uint32_t icb0, std::uint32_t ocb) {
    tt_emu::hw_startup("compute_kernel_hw_startup", icb0, icb0, ocb);
}

}  // namespace ckernel
