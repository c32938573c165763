// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_unary/gelu.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

template <bool fast_and_approx = true>
void gelu_tile_init();

template <bool fast_and_approx = true>
void gelu_tile(std::uint32_t idst);

}  // namespace ckernel
