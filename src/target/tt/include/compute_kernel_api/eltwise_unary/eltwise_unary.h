// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/eltwise_unary.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

ALWI void unary_op_init_common(std::uint32_t icb, std::uint32_t ocb) {
    tt_emu::hw_startup("unary_op_init_common", icb, icb, ocb);
    tt_emu::fpu_init(tt_emu::FPU_COPY, icb, icb, 0u, "unary_op_init_common");
}
ALWI void init_sfpu(std::uint32_t icb, std::uint32_t ocb) { unary_op_init_common(icb, ocb); }

}  // namespace ckernel
