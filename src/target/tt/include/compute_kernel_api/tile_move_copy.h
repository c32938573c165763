// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/tile_move_copy.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void copy_tile_to_dst_init_short(std::uint32_t cbid, std::uint32_t transpose = 0);
void copy_tile_init(std::uint32_t cbid);
void copy_tile_to_dst_init_short_with_dt(std::uint32_t old_cbid, std::uint32_t new_cbid, std::uint32_t transpose = 0);
void copy_tile(std::uint32_t in_cb_id, std::uint32_t in_tile_index, std::uint32_t dst_tile_index);

}  // namespace ckernel
