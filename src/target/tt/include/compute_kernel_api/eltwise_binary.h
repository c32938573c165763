// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_binary.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

ALWI void binary_op_init_common(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb) {
    tt_emu::hw_startup("binary_op_init_common", icb0, icb1, ocb);
}
ALWI void add_tiles_init(std::uint32_t icb0, std::uint32_t icb1, bool acc_to_dest = false) {
    tt_emu::fpu_init(tt_emu::FPU_ADD, icb0, icb1, acc_to_dest ? 1u : 0u, "add_tiles_init");
}
ALWI void sub_tiles_init(std::uint32_t icb0, std::uint32_t icb1, bool acc_to_dest = false) {
    tt_emu::fpu_init(tt_emu::FPU_SUB, icb0, icb1, acc_to_dest ? 1u : 0u, "sub_tiles_init");
}
ALWI void mul_tiles_init(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_MUL, icb0, icb1, 0u, "mul_tiles_init");
}
ALWI void add_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_ADD, icb0, icb1, itile0, itile1, idst, "add_tiles");
}
ALWI void sub_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_SUB, icb0, icb1, itile0, itile1, idst, "sub_tiles");
}
ALWI void mul_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_MUL, icb0, icb1, itile0, itile1, idst, "mul_tiles");
}

}  // namespace ckernel
