// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/compute_kernel_hw_startup.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void compute_kernel_hw_startup(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb);
void compute_kernel_hw_startup(std::uint32_t icb0, std::uint32_t ocb);

}  // namespace ckernel
