// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/matmul.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

void mm_init(std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, std::uint32_t out_cb_id, const std::uint32_t transpose = 0);
void matmul_tiles(
    std::uint32_t in0_cb_id,
    std::uint32_t in1_cb_id,
    std::uint32_t in0_tile_index,
    std::uint32_t in1_tile_index,
    std::uint32_t idst,
    const std::uint32_t transpose);
void mm_init_short(std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, const std::uint32_t transpose = 0);
void mm_init_short_with_dt(
    std::uint32_t in0_cb_id, std::uint32_t in1_cb_id, std::uint32_t c_in_old_srca, const std::uint32_t transpose = 0);

}  // namespace ckernel
