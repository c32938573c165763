// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_unary/exp.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

template <bool approx = false, bool fast_and_approx = true, std::uint32_t scale = 0x3F800000>
void exp_tile_init();

template <bool approx = false, bool fast_and_approx = true, bool scale_en = false, bool skip_positive_check = false,
          int iterations = 8>
void exp_tile(std::uint32_t idst, int vector_mode = (int)VectorMode::RC, std::uint16_t scale = p_sfpu::kCONST_1_FP16B);

}  // namespace ckernel
