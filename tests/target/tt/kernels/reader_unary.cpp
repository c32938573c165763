// Reader for unary ops: tiles [start_tile, start_tile + num_tiles) of X into CB c_0.
// Pinned API: tt-metal v0.62.2.
// Runtime args: src_addr, start_tile, num_tiles.  Compile-time args: TensorAccessorArgs(X).
#include <cstdint>

#include "dataflow_api.h"

void kernel_main() {
    const uint32_t src_addr = get_arg_val<uint32_t>(0);
    const uint32_t start_tile = get_arg_val<uint32_t>(1);
    const uint32_t num_tiles = get_arg_val<uint32_t>(2);

    constexpr uint32_t cb_in = tt::CBIndex::c_0;
    constexpr auto src_args = TensorAccessorArgs<0>();
    const auto src = TensorAccessor(src_args, src_addr, get_tile_size(cb_in));

    for (uint32_t t = start_tile; t < start_tile + num_tiles; ++t) {
        cb_reserve_back(cb_in, 1);
        noc_async_read_tile(t, src, get_write_ptr(cb_in));
        noc_async_read_barrier();
        cb_push_back(cb_in, 1);
    }
}
