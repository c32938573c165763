// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/eltwise_binary.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

void binary_op_init_common(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb);
void add_tiles_init(std::uint32_t icb0, std::uint32_t icb1, bool acc_to_dest = false);
void sub_tiles_init(std::uint32_t icb0, std::uint32_t icb1, bool acc_to_dest = false);
void mul_tiles_init(std::uint32_t icb0, std::uint32_t icb1);
void add_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
void sub_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
void mul_tiles(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);

}  // namespace ckernel
