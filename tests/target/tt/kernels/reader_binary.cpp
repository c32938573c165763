// Reader for element-wise binary ops: tiles [start_tile, start_tile + num_tiles) of A and B into
// CB c_0 / c_1. Pinned API: tt-metal v0.62.2.
// Runtime args: a_addr, b_addr, start_tile, num_tiles.
// Compile-time args: TensorAccessorArgs(A), TensorAccessorArgs(B).
#include <cstdint>

#include "dataflow_api.h"

void kernel_main() {
    const uint32_t a_addr = get_arg_val<uint32_t>(0);
    const uint32_t b_addr = get_arg_val<uint32_t>(1);
    const uint32_t start_tile = get_arg_val<uint32_t>(2);
    const uint32_t num_tiles = get_arg_val<uint32_t>(3);

    constexpr uint32_t cb_a = tt::CBIndex::c_0;
    constexpr uint32_t cb_b = tt::CBIndex::c_1;

    constexpr auto a_args = TensorAccessorArgs<0>();
    const auto a = TensorAccessor(a_args, a_addr, get_tile_size(cb_a));
    constexpr auto b_args = TensorAccessorArgs<a_args.next_compile_time_args_offset()>();
    const auto b = TensorAccessor(b_args, b_addr, get_tile_size(cb_b));

    for (uint32_t t = start_tile; t < start_tile + num_tiles; ++t) {
        cb_reserve_back(cb_a, 1);
        cb_reserve_back(cb_b, 1);
        noc_async_read_tile(t, a, get_write_ptr(cb_a));
        noc_async_read_tile(t, b, get_write_ptr(cb_b));
        noc_async_read_barrier();
        cb_push_back(cb_a, 1);
        cb_push_back(cb_b, 1);
    }
}
