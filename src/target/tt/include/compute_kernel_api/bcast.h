// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/bcast.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common.h"

namespace ckernel {

// ROW broadcast: row 0 of the second operand's tile is added to / multiplied into every row.
void add_bcast_rows_init_short(std::uint32_t icb0, std::uint32_t icb1);
void add_tiles_bcast_rows(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
void mul_bcast_rows_init_short(std::uint32_t icb0, std::uint32_t icb1);
void mul_tiles_bcast_rows(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
// COL broadcast: column 0 of the second operand's tile is broadcast across columns.
void add_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1);
void add_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
void mul_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1);
void mul_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);
void sub_bcast_cols_init_short(std::uint32_t icb0, std::uint32_t icb1);
void sub_tiles_bcast_cols(std::uint32_t icb0, std::uint32_t icb1, std::uint32_t itile0, std::uint32_t itile1, std::uint32_t idst);

}  // namespace ckernel
