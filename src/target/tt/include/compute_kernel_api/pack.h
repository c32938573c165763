// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/pack.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

template <bool out_of_order_output = false>
void pack_tile(std::uint32_t ifrom_dst, std::uint32_t icb, std::uint32_t output_tile_index = 0);

void pack_reconfig_data_format(const std::uint32_t new_cb_id);
void pack_reconfig_data_format(const std::uint32_t old_cb_id, const std::uint32_t new_cb_id);

}  // namespace ckernel
