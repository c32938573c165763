// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/reg_api.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

// DST register ownership: MATH acquires and commits, PACK waits and releases.
ALWI void tile_regs_acquire() { tt_emu::dst_acquire(); }
ALWI void tile_regs_commit() { tt_emu::dst_commit(); }
ALWI void tile_regs_wait() { tt_emu::dst_wait(); }
ALWI void tile_regs_release() { tt_emu::dst_release(); }

// Older single-call form (acquire for math and pack at once).
ALWI void acquire_dst() { tt_emu::dst_acquire_full(); }
ALWI void release_dst() { tt_emu::dst_release_full(); }

}  // namespace ckernel
