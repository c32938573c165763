// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt_emu/runtime_api.h, the emulator's entry points (not tt-metal's).
// The kernel-facing headers of this include tree are thin inline wrappers over these functions,
// which the emulator runner (ttemu_runner) defines and exports to the kernel shared objects.
#pragma once

#include <cstdint>
#include <cstring>

#define TT_EMU_API __attribute__((visibility("default")))

namespace tt_emu {

// FPU (unpack + math) configurations a compute kernel selects with its *_init calls.
enum FpuMode : int {
    FPU_NONE = 0,
    FPU_MATMUL,
    FPU_ADD,
    FPU_SUB,
    FPU_MUL,
    FPU_ADD_BCAST_ROWS,
    FPU_MUL_BCAST_ROWS,
    FPU_ADD_BCAST_COLS,
    FPU_MUL_BCAST_COLS,
    FPU_COPY,
    FPU_SUB_BCAST_COLS,
    FPU_REDUCE_SUM_ROW,
    FPU_REDUCE_MAX_ROW,
    FPU_TRANSPOSE,
};

// SFPU operations (configured by their *_tile_init, applied in place on a DST tile).
enum SfpuOp : int { SFPU_NONE = 0, SFPU_EXP, SFPU_GELU, SFPU_GELU_APPROX, SFPU_RELU, SFPU_BINOP_SCALAR, SFPU_SQRT, SFPU_RECIP, SFPU_MAX };
// The modes of binop_with_scalar (add_unary_tile ... rsub_unary_tile): DST tile (op) scalar.
enum ScalarOp : int { SCALAR_ADD = 0, SCALAR_SUB, SCALAR_MUL, SCALAR_DIV, SCALAR_RSUB };

// ---- arguments / identity ---------------------------------------------------------------------
TT_EMU_API std::uint32_t runtime_arg(int idx);
TT_EMU_API std::uint32_t common_runtime_arg(int idx);

// A 4-byte runtime argument reinterpreted as T (get_arg_val / get_common_arg_val, dataflow and compute).
template <typename T>
inline T arg_as(std::uint32_t raw) {
    static_assert(sizeof(T) == 4, "Error: only 4B args are supported");
    T value;
    std::memcpy(&value, &raw, sizeof(T));
    return value;
}
TT_EMU_API std::uint32_t core_x();
TT_EMU_API std::uint32_t core_y();
[[noreturn]] TT_EMU_API void unsupported(const char* what);

// ---- circular buffers -------------------------------------------------------------------------
TT_EMU_API void cb_reserve_back(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API void cb_push_back(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API void cb_wait_front(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API void cb_pop_front(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API bool cb_pages_reservable_at_back(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API bool cb_pages_available_at_front(std::int32_t cb, std::int32_t num_pages);
TT_EMU_API std::uint32_t get_write_ptr(std::uint32_t cb);
TT_EMU_API std::uint32_t get_read_ptr(std::uint32_t cb);
TT_EMU_API std::uint32_t cb_page_size(std::uint32_t cb);
TT_EMU_API std::uint32_t cb_data_format(std::uint32_t cb);

// ---- NoC ------------------------------------------------------------------------------------
TT_EMU_API std::uint64_t interleaved_noc_addr(
    bool is_dram, std::uint32_t bank_base_address, std::uint32_t page_size, std::uint32_t page_id, std::uint32_t offset);
TT_EMU_API std::uint64_t core_noc_addr(std::uint32_t noc_x, std::uint32_t noc_y, std::uint32_t addr);
TT_EMU_API std::uint64_t local_noc_addr(std::uint32_t addr);
TT_EMU_API void noc_read(std::uint64_t src_noc_addr, std::uint32_t dst_l1_addr, std::uint32_t size);
TT_EMU_API void noc_write(std::uint32_t src_l1_addr, std::uint64_t dst_noc_addr, std::uint32_t size);
TT_EMU_API void noc_read_barrier();
TT_EMU_API void noc_write_barrier();

// ---- compute ----------------------------------------------------------------------------------
TT_EMU_API void hw_startup(const char* api, std::uint32_t icb0, std::uint32_t icb1, std::uint32_t ocb);
TT_EMU_API void fpu_init(int mode, std::uint32_t icb0, std::uint32_t icb1, std::uint32_t flags, const char* api);
TT_EMU_API void dst_acquire();
TT_EMU_API void dst_commit();
TT_EMU_API void dst_wait();
TT_EMU_API void dst_release();
TT_EMU_API void dst_acquire_full();
TT_EMU_API void dst_release_full();
TT_EMU_API void matmul_tiles(
    std::uint32_t in0_cb, std::uint32_t in1_cb, std::uint32_t in0_tile, std::uint32_t in1_tile, std::uint32_t idst,
    std::uint32_t transpose);
TT_EMU_API void reduce_tiles(int mode, std::uint32_t icb, std::uint32_t iscaler, std::uint32_t itile,
                             std::uint32_t itile_scaler, std::uint32_t idst, const char* api);
TT_EMU_API void binary_tiles(
    int mode, std::uint32_t in0_cb, std::uint32_t in1_cb, std::uint32_t in0_tile, std::uint32_t in1_tile,
    std::uint32_t idst, const char* api);
TT_EMU_API void copy_tile(std::uint32_t in_cb, std::uint32_t in_tile, std::uint32_t idst);
TT_EMU_API void transpose_tile(std::uint32_t in_cb, std::uint32_t in_tile, std::uint32_t idst);
TT_EMU_API void sfpu_init(int op, const char* api);
TT_EMU_API void sfpu_apply(int op, std::uint32_t idst, float scale, const char* api);
TT_EMU_API void sfpu_binary(int op, std::uint32_t idst0, std::uint32_t idst1, const char* api);
TT_EMU_API void sfpu_scalar(int mode, std::uint32_t idst, std::uint32_t bits, const char* api);
TT_EMU_API void pack_tile(std::uint32_t idst, std::uint32_t ocb, std::uint32_t output_tile_index, bool out_of_order);
TT_EMU_API void pack_reconfig(std::uint32_t ocb);

}  // namespace tt_emu
