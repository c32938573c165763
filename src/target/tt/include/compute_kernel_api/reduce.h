// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/reduce.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// The template arguments are given explicitly (the real header defaults them to the REDUCE_OP /
// REDUCE_DIM defines), so there are no defaults here: stricter than the real one. REDUCE_ROW only: each
// row of the tile (sum or max, times the scaler tile's first element) lands in column 0 of the DST
// tile; the first reduce_tile on a DST tile after tile_regs_acquire writes it, later ones accumulate.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

enum PoolType { SUM, AVG, MAX };
enum ReduceDim { REDUCE_ROW, REDUCE_COL, REDUCE_SCALAR };

template <PoolType reduce_type, ReduceDim reduce_dim>
ALWI void reduce_init(std::uint32_t icb, std::uint32_t icb_scaler, std::uint32_t ocb) {
    static_assert(reduce_dim == REDUCE_ROW, "the emulator models REDUCE_ROW reductions only");
    static_assert(reduce_type != AVG, "the emulator models SUM and MAX reductions only");
    (void)ocb;
    tt_emu::fpu_init(reduce_type == MAX ? tt_emu::FPU_REDUCE_MAX_ROW : tt_emu::FPU_REDUCE_SUM_ROW, icb, icb_scaler, 0u,
                     "reduce_init");
}
ALWI void reduce_uninit() {}
template <PoolType reduce_type, ReduceDim reduce_dim>
ALWI void reduce_tile(std::uint32_t icb, std::uint32_t icb_scaler, std::uint32_t itile, std::uint32_t itile_scaler,
                      std::uint32_t idst) {
    static_assert(reduce_dim == REDUCE_ROW, "the emulator models REDUCE_ROW reductions only");
    tt_emu::reduce_tiles(reduce_type == MAX ? tt_emu::FPU_REDUCE_MAX_ROW : tt_emu::FPU_REDUCE_SUM_ROW, icb, icb_scaler,
                         itile, itile_scaler, idst, "reduce_tile");
}

}  // namespace ckernel
