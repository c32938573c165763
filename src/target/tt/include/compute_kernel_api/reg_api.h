// Tessera stub of tt-metal v0.62.2 (2025-08-20): compute_kernel_api/reg_api.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

// DST register ownership: MATH acquires and commits, PACK waits and releases.
void tile_regs_acquire();
void tile_regs_commit();
void tile_regs_wait();
void tile_regs_release();

// Older single-call form (acquire for math and pack at once).
void acquire_dst();
void release_dst();

}  // namespace ckernel
