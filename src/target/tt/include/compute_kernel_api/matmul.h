// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/matmul.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

ALWI void mm_init(std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, std::uint32_t out_cb_id, const std::uint32_t transpose = 0) {
    tt_emu::hw_startup("mm_init", in0_cb_id, in1_cb_id, out_cb_id);
    tt_emu::fpu_init(tt_emu::FPU_MATMUL, in0_cb_id, in1_cb_id, transpose, "mm_init");
}
ALWI void matmul_tiles(
    std::uint32_t in0_cb_id,
    std::uint32_t in1_cb_id,
    std::uint32_t in0_tile_index,
    std::uint32_t in1_tile_index,
    std::uint32_t idst,
    const std::uint32_t transpose) {
    tt_emu::matmul_tiles(in0_cb_id, in1_cb_id, in0_tile_index, in1_tile_index, idst, transpose);
}
ALWI void mm_init_short(std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, const std::uint32_t transpose = 0) {
    tt_emu::fpu_init(tt_emu::FPU_MATMUL, in0_cb_id, in1_cb_id, transpose, "mm_init_short");
}
ALWI void mm_init_short_with_dt(
    std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, std::uint32_t /*c_in_old_srca*/, const std::uint32_t transpose = 0) {
    tt_emu::fpu_init(tt_emu::FPU_MATMUL, in0_cb_id, in1_cb_id, transpose, "mm_init_short_with_dt");
}

}  // namespace ckernel
