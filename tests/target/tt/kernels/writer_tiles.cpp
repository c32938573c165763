// Writer: drains CB c_16 into output tiles [start_tile, start_tile + num_tiles) of an interleaved
// DRAM buffer. Pinned API: tt-metal v0.62.2.
// Runtime args: dst_addr, start_tile, num_tiles.  Compile-time args: TensorAccessorArgs(dst).
#include <cstdint>

#include "dataflow_api.h"

void kernel_main() {
    const uint32_t dst_addr = get_arg_val<uint32_t>(0);
    const uint32_t start_tile = get_arg_val<uint32_t>(1);
    const uint32_t num_tiles = get_arg_val<uint32_t>(2);

    constexpr uint32_t cb_out = tt::CBIndex::c_16;
    constexpr auto dst_args = TensorAccessorArgs<0>();
    const auto dst = TensorAccessor(dst_args, dst_addr, get_tile_size(cb_out));

    for (uint32_t t = start_tile; t < start_tile + num_tiles; ++t) {
        cb_wait_front(cb_out, 1);
        noc_async_write_tile(t, dst, get_read_ptr(cb_out));
        noc_async_write_barrier();
        cb_pop_front(cb_out, 1);
    }
}
