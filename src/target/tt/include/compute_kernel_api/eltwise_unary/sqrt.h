// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_unary/sqrt.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// The element-wise square root of a DST tile, on the SFPU.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void sqrt_tile_init();
void sqrt_tile(std::uint32_t idst);

}  // namespace ckernel
