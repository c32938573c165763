// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/pack.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

template <bool out_of_order_output = false>
ALWI void pack_tile(std::uint32_t ifrom_dst, std::uint32_t icb, std::uint32_t output_tile_index = 0) {
    tt_emu::pack_tile(ifrom_dst, icb, output_tile_index, out_of_order_output);
}

// The packer converts DST to the format of the CB it was configured for: packing into a CB of
// another format needs this first (the emulator checks it in pack_tile).
ALWI void pack_reconfig_data_format(const std::uint32_t new_cb_id) { tt_emu::pack_reconfig(new_cb_id); }
ALWI void pack_reconfig_data_format(const std::uint32_t /*old_cb_id*/, const std::uint32_t new_cb_id) {
    tt_emu::pack_reconfig(new_cb_id);
}

}  // namespace ckernel
