// Reader for C = gelu(A @ B + bias): the GEMM tile pairs into c_0 / c_1 and, after each output
// tile's K loop, bias tile (0, nt) into c_2. The bias is a [N] row stored as a [32, Npad] tile
// row (row 0 valid, padding zero). Pinned API: tt-metal v0.62.2.
// Runtime args: a_addr, b_addr, bias_addr, Kt, Nt, start_tile, num_tiles.
// Compile-time args: TensorAccessorArgs(A), TensorAccessorArgs(B), TensorAccessorArgs(bias).
#include <cstdint>

#include "dataflow_api.h"

void kernel_main() {
    const uint32_t a_addr = get_arg_val<uint32_t>(0);
    const uint32_t b_addr = get_arg_val<uint32_t>(1);
    const uint32_t bias_addr = get_arg_val<uint32_t>(2);
    const uint32_t Kt = get_arg_val<uint32_t>(3);
    const uint32_t Nt = get_arg_val<uint32_t>(4);
    const uint32_t start_tile = get_arg_val<uint32_t>(5);
    const uint32_t num_tiles = get_arg_val<uint32_t>(6);

    constexpr uint32_t cb_a = tt::CBIndex::c_0;
    constexpr uint32_t cb_b = tt::CBIndex::c_1;
    constexpr uint32_t cb_bias = tt::CBIndex::c_2;

    constexpr auto a_args = TensorAccessorArgs<0>();
    const auto a = TensorAccessor(a_args, a_addr, get_tile_size(cb_a));
    constexpr auto b_args = TensorAccessorArgs<a_args.next_compile_time_args_offset()>();
    const auto b = TensorAccessor(b_args, b_addr, get_tile_size(cb_b));
    constexpr auto bias_args = TensorAccessorArgs<b_args.next_compile_time_args_offset()>();
    const auto bias = TensorAccessor(bias_args, bias_addr, get_tile_size(cb_bias));

    for (uint32_t t = start_tile; t < start_tile + num_tiles; ++t) {
        const uint32_t mt = t / Nt;
        const uint32_t nt = t % Nt;
        for (uint32_t kt = 0; kt < Kt; ++kt) {
            cb_reserve_back(cb_a, 1);
            noc_async_read_tile(mt * Kt + kt, a, get_write_ptr(cb_a));
            cb_reserve_back(cb_b, 1);
            noc_async_read_tile(kt * Nt + nt, b, get_write_ptr(cb_b));
            noc_async_read_barrier();
            cb_push_back(cb_a, 1);
            cb_push_back(cb_b, 1);
        }
        cb_reserve_back(cb_bias, 1);
        noc_async_read_tile(nt, bias, get_write_ptr(cb_bias));
        noc_async_read_barrier();
        cb_push_back(cb_bias, 1);
    }
}
