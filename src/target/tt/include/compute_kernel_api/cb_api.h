// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/cb_api.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void cb_wait_front(std::uint32_t cbid, std::uint32_t ntiles);
void cb_pop_front(std::uint32_t cbid, std::uint32_t ntiles);
void cb_reserve_back(std::uint32_t cbid, std::uint32_t ntiles);
void cb_push_back(std::uint32_t cbid, std::uint32_t ntiles);

}  // namespace ckernel
