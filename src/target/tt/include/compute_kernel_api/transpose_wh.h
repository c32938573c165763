// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/transpose_wh.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// A tile transposed (B[w, h] = A[h, w]) on its way from a CB into DST.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

void transpose_wh_init(std::uint32_t icb, std::uint32_t ocb);
void transpose_wh_init_short(std::uint32_t icb);
void transpose_wh_tile(std::uint32_t icb, std::uint32_t itile, std::uint32_t idst);

}  // namespace ckernel
