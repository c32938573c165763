// Deliberately broken compute kernel: waits on CB c_5, which the plan configures but no kernel
// ever pushes. The emulator must report the deadlock (core, kernel, CB) instead of hanging.
#include <cstdint>

#include "compute_kernel_api/common.h"
#include "compute_kernel_api/eltwise_unary/eltwise_unary.h"
#include "compute_kernel_api/tile_move_copy.h"

namespace NAMESPACE {
void MAIN {
    const uint32_t num_tiles = get_arg_val<uint32_t>(0);

    constexpr uint32_t cb_never = tt::CBIndex::c_5;
    constexpr uint32_t cb_out = tt::CBIndex::c_16;

    init_sfpu(cb_never, cb_out);
    for (uint32_t i = 0; i < num_tiles; ++i) {
        tile_regs_acquire();
        cb_wait_front(cb_never, 1);
        copy_tile(cb_never, 0, 0);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_out, 1);
        pack_tile(0, cb_out);
        cb_push_back(cb_out, 1);
        tile_regs_release();
        cb_pop_front(cb_never, 1);
    }
}
}  // namespace NAMESPACE
