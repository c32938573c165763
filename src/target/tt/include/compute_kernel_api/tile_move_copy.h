// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/tile_move_copy.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void copy_tile_to_dst_init_short(std::uint32_t cbid, std::uint32_t transpose = 0) {
    if (transpose != 0) {
        tt_emu::unsupported("copy_tile_to_dst_init_short with transpose");
    }
    tt_emu::fpu_init(tt_emu::FPU_COPY, cbid, cbid, 0u, "copy_tile_to_dst_init_short");
}
ALWI void copy_tile_init(std::uint32_t cbid) { tt_emu::fpu_init(tt_emu::FPU_COPY, cbid, cbid, 0u, "copy_tile_init"); }
ALWI void copy_tile_to_dst_init_short_with_dt(std::uint32_t /*old_cbid*/, std::uint32_t new_cbid, std::uint32_t transpose = 0) {
    copy_tile_to_dst_init_short(new_cbid, transpose);
}
ALWI void copy_tile(std::uint32_t in_cb_id, std::uint32_t in_tile_index, std::uint32_t dst_tile_index) {
    tt_emu::copy_tile(in_cb_id, in_tile_index, dst_tile_index);
}

}  // namespace ckernel
