// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/cb_api.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void cb_wait_front(std::uint32_t cbid, std::uint32_t ntiles) { tt_emu::cb_wait_front(cbid, ntiles); }
ALWI void cb_pop_front(std::uint32_t cbid, std::uint32_t ntiles) { tt_emu::cb_pop_front(cbid, ntiles); }
ALWI void cb_reserve_back(std::uint32_t cbid, std::uint32_t ntiles) { tt_emu::cb_reserve_back(cbid, ntiles); }
ALWI void cb_push_back(std::uint32_t cbid, std::uint32_t ntiles) { tt_emu::cb_push_back(cbid, ntiles); }

}  // namespace ckernel
