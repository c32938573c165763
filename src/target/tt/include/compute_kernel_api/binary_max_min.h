// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/binary_max_min.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// The element-wise maximum of two DST tiles on the SFPU; the result overwrites the first operand.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

void binary_max_tile_init();
void binary_max_tile(std::uint32_t idst0, std::uint32_t idst1);

}  // namespace ckernel
