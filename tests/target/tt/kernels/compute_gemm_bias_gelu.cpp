// Compute for C = gelu(A @ B + bias). Per output tile: the K loop accumulates A @ B in DST[0] and
// packs it to the intermediate CB c_24; the epilogue adds the bias row (row broadcast) and applies
// gelu on the SFPU, then packs to c_16. Inits are hoisted; the two FPU modes (matmul, row-broadcast
// add) are switched with the short inits. Pinned API: tt-metal v0.62.2.
// Runtime args: num_tiles, Kt.  CBs: c_0 = A, c_1 = B, c_2 = bias, c_24 = A@B, c_16 = C.
#include <cstdint>

#include "compute_kernel_api/bcast.h"
#include "compute_kernel_api/common.h"
#include "compute_kernel_api/eltwise_unary/gelu.h"
#include "compute_kernel_api/matmul.h"

namespace NAMESPACE {
void MAIN {
    const uint32_t num_tiles = get_arg_val<uint32_t>(0);
    const uint32_t Kt = get_arg_val<uint32_t>(1);

    constexpr uint32_t cb_a = tt::CBIndex::c_0;
    constexpr uint32_t cb_b = tt::CBIndex::c_1;
    constexpr uint32_t cb_bias = tt::CBIndex::c_2;
    constexpr uint32_t cb_out = tt::CBIndex::c_16;
    constexpr uint32_t cb_acc = tt::CBIndex::c_24;

    mm_init(cb_a, cb_b, cb_acc);
    gelu_tile_init();

    for (uint32_t i = 0; i < num_tiles; ++i) {
        // Main loop: acc = A(mt, :) @ B(:, nt).
        mm_init_short(cb_a, cb_b);
        tile_regs_acquire();
        for (uint32_t kt = 0; kt < Kt; ++kt) {
            cb_wait_front(cb_a, 1);
            cb_wait_front(cb_b, 1);
            matmul_tiles(cb_a, cb_b, 0, 0, 0, false);
            cb_pop_front(cb_a, 1);
            cb_pop_front(cb_b, 1);
        }
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_acc, 1);
        pack_tile(0, cb_acc);
        cb_push_back(cb_acc, 1);
        tile_regs_release();

        // Epilogue: out = gelu(acc + bias[row 0 broadcast]).
        add_bcast_rows_init_short(cb_acc, cb_bias);
        cb_wait_front(cb_acc, 1);
        cb_wait_front(cb_bias, 1);
        tile_regs_acquire();
        add_tiles_bcast_rows(cb_acc, cb_bias, 0, 0, 0);
        gelu_tile(0);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_out, 1);
        pack_tile(0, cb_out);
        cb_push_back(cb_out, 1);
        tile_regs_release();
        cb_pop_front(cb_acc, 1);
        cb_pop_front(cb_bias, 1);
    }
}
}  // namespace NAMESPACE
