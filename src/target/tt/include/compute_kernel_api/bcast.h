// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/bcast.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

// ROW broadcast: row 0 of the second operand's tile is added to / multiplied into every row.
ALWI void add_bcast_rows_init_short(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_ADD_BCAST_ROWS, icb0, icb1, 0u, "add_bcast_rows_init_short");
}
ALWI void add_tiles_bcast_rows(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_ADD_BCAST_ROWS, icb0, icb1, itile0, itile1, idst, "add_tiles_bcast_rows");
}
ALWI void mul_bcast_rows_init_short(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_MUL_BCAST_ROWS, icb0, icb1, 0u, "mul_bcast_rows_init_short");
}
ALWI void mul_tiles_bcast_rows(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_MUL_BCAST_ROWS, icb0, icb1, itile0, itile1, idst, "mul_tiles_bcast_rows");
}
// COL broadcast: column 0 of the second operand's tile is broadcast across columns.
ALWI void add_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_ADD_BCAST_COLS, icb0, icb1, 0u, "add_bcast_cols_init_short");
}
ALWI void add_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_ADD_BCAST_COLS, icb0, icb1, itile0, itile1, idst, "add_tiles_bcast_cols");
}
ALWI void mul_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_MUL_BCAST_COLS, icb0, icb1, 0u, "mul_bcast_cols_init_short");
}
ALWI void mul_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_MUL_BCAST_COLS, icb0, icb1, itile0, itile1, idst, "mul_tiles_bcast_cols");
}

ALWI void sub_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1) {
    tt_emu::fpu_init(tt_emu::FPU_SUB_BCAST_COLS, icb0, icb1, 0u, "sub_bcast_cols_init_short");
}
ALWI void sub_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst) {
    tt_emu::binary_tiles(tt_emu::FPU_SUB_BCAST_COLS, icb0, icb1, itile0, itile1, idst, "sub_tiles_bcast_cols");
}

}  // namespace ckernel
