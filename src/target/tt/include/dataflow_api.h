// Tessera's tt-metal v0.62.2 (2025-08-20) API: dataflow_api.h (tt_metal/hw/inc/dataflow_api.h)
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// Data-movement kernels include this header and define `void kernel_main()`.
// NoC transfers complete immediately; the emulator still checks that barriers come before the
// CB pages they fill/drain are pushed/popped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "accessor/tensor_accessor.h"
#include "compile_time_args.h"
#include "hostdevcommon/kernel_structs.h"
#include "tensix_types.h"
#include "tt_emu/runtime_api.h"

#define FORCE_INLINE inline __attribute__((always_inline))
#define tt_l1_ptr
#define tt_reg_ptr

constexpr std::uint8_t noc_index = 0;

// ---- kernel arguments -------------------------------------------------------------------------
inline std::uint32_t get_arg_addr(int) { tt_emu::unsupported("get_arg_addr (runtime args do not live in emulated L1)"); }
inline std::uint32_t get_common_arg_addr(int) {
    tt_emu::unsupported("get_common_arg_addr (runtime args do not live in emulated L1)");
}
template <typename T>
inline T get_arg_val(int arg_idx) {
    return tt_emu::arg_as<T>(tt_emu::runtime_arg(arg_idx));
}
template <typename T>
inline T get_common_arg_val(int arg_idx) {
    return tt_emu::arg_as<T>(tt_emu::common_runtime_arg(arg_idx));
}

// ---- core coordinates -------------------------------------------------------------------------
inline std::uint8_t get_absolute_logical_x() { return static_cast<std::uint8_t>(tt_emu::core_x()); }
inline std::uint8_t get_absolute_logical_y() { return static_cast<std::uint8_t>(tt_emu::core_y()); }
inline std::uint8_t get_relative_logical_x() { return static_cast<std::uint8_t>(tt_emu::core_x()); }
inline std::uint8_t get_relative_logical_y() { return static_cast<std::uint8_t>(tt_emu::core_y()); }

// ---- circular buffers -------------------------------------------------------------------------
inline void cb_push_back(const std::int32_t operand, const std::int32_t num_pages) { tt_emu::cb_push_back(operand, num_pages); }
inline void cb_pop_front(std::int32_t operand, std::int32_t num_pages) { tt_emu::cb_pop_front(operand, num_pages); }
inline void cb_reserve_back(std::int32_t operand, std::int32_t num_pages) { tt_emu::cb_reserve_back(operand, num_pages); }
inline void cb_wait_front(std::int32_t operand, std::int32_t num_pages) { tt_emu::cb_wait_front(operand, num_pages); }
inline bool cb_pages_reservable_at_back(std::int32_t operand, std::int32_t num_pages) {
    return tt_emu::cb_pages_reservable_at_back(operand, num_pages);
}
inline bool cb_pages_available_at_front(std::int32_t operand, std::int32_t num_pages) {
    return tt_emu::cb_pages_available_at_front(operand, num_pages);
}
inline std::uint32_t get_write_ptr(std::uint32_t operand) { return tt_emu::get_write_ptr(operand); }
inline std::uint32_t get_read_ptr(std::uint32_t operand) { return tt_emu::get_read_ptr(operand); }
inline std::int32_t get_tile_size(const std::int32_t operand) {
    return static_cast<std::int32_t>(tt_emu::cb_page_size(static_cast<std::uint32_t>(operand)));
}
inline DataFormat get_dataformat(const std::int32_t operand) {
    return static_cast<DataFormat>(tt_emu::cb_data_format(static_cast<std::uint32_t>(operand)));
}

// ---- NoC addresses ----------------------------------------------------------------------------
inline std::uint64_t get_noc_addr(std::uint32_t noc_x, std::uint32_t noc_y, std::uint32_t addr, std::uint8_t = noc_index) {
    return tt_emu::core_noc_addr(noc_x, noc_y, addr);
}
inline std::uint64_t get_noc_addr(std::uint32_t addr, std::uint8_t = noc_index) { return tt_emu::local_noc_addr(addr); }
template <typename DSpec>
inline std::uint64_t get_noc_addr(
    const std::uint32_t id, const TensorAccessor<DSpec>& s, std::uint32_t offset = 0, std::uint8_t noc = noc_index) {
    return s.get_noc_addr(id, offset, noc);
}

template <bool DRAM, std::uint32_t tile_hw = 1024>
struct InterleavedAddrGenFast {
    std::uint32_t bank_base_address;
    std::uint32_t page_size;
    DataFormat data_format;
    std::uint64_t get_noc_addr(const std::uint32_t id, const std::uint32_t offset = 0, std::uint8_t = noc_index) const {
        return tt_emu::interleaved_noc_addr(DRAM, bank_base_address, page_size, id, offset);
    }
};

// ---- NoC transfers ----------------------------------------------------------------------------
inline void noc_async_read(std::uint64_t src_noc_addr, std::uint32_t dst_local_l1_addr, std::uint32_t size, std::uint8_t = noc_index) {
    tt_emu::noc_read(src_noc_addr, dst_local_l1_addr, size);
}
inline void noc_async_write(std::uint32_t src_local_l1_addr, std::uint64_t dst_noc_addr, std::uint32_t size, std::uint8_t = noc_index) {
    tt_emu::noc_write(src_local_l1_addr, dst_noc_addr, size);
}

template <typename DSpec>
inline void noc_async_read_tile(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index) {
    tt_emu::noc_read(s.get_noc_addr(id, offset, noc), dst_local_l1_addr, s.page_size);
}
template <typename DSpec>
inline void noc_async_write_tile(
    const std::uint32_t id, const TensorAccessor<DSpec>& s, std::uint32_t src_local_l1_addr, std::uint8_t noc = noc_index) {
    tt_emu::noc_write(src_local_l1_addr, s.get_noc_addr(id, 0, noc), s.page_size);
}
template <typename DSpec>
inline void noc_async_read_page(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index) {
    tt_emu::noc_read(s.get_noc_addr(id, offset, noc), dst_local_l1_addr, s.page_size);
}
template <typename DSpec>
inline void noc_async_write_page(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t src_local_l1_addr,
    const std::uint32_t write_size_bytes,
    const std::uint32_t offset = 0,
    std::uint8_t noc = noc_index) {
    tt_emu::noc_write(src_local_l1_addr, s.get_noc_addr(id, offset, noc), write_size_bytes);
}

template <bool DRAM, std::uint32_t tile_hw>
inline void noc_async_read_tile(
    const std::uint32_t id,
    const InterleavedAddrGenFast<DRAM, tile_hw>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index) {
    tt_emu::noc_read(s.get_noc_addr(id, offset, noc), dst_local_l1_addr, s.page_size);
}
template <bool DRAM, std::uint32_t tile_hw>
inline void noc_async_write_tile(
    const std::uint32_t id,
    const InterleavedAddrGenFast<DRAM, tile_hw>& s,
    std::uint32_t src_local_l1_addr,
    std::uint8_t noc = noc_index) {
    tt_emu::noc_write(src_local_l1_addr, s.get_noc_addr(id, 0, noc), s.page_size);
}

inline void noc_async_read_barrier(std::uint8_t = noc_index) { tt_emu::noc_read_barrier(); }
inline void noc_async_write_barrier(std::uint8_t = noc_index) { tt_emu::noc_write_barrier(); }
inline void noc_async_writes_flushed(std::uint8_t = noc_index) { tt_emu::noc_write_barrier(); }
inline void noc_async_full_barrier(std::uint8_t = noc_index) {
    tt_emu::noc_read_barrier();
    tt_emu::noc_write_barrier();
}

// Entry point the emulator calls (the kernel's translation unit defines kernel_main()).
void kernel_main();
#define TT_EMU_DEFINE_ENTRY \
    extern "C" __attribute__((visibility("default"))) void tt_emu_kernel_entry() { kernel_main(); } \
    extern "C" __attribute__((visibility("default"))) const int tt_emu_kernel_kind = 0;
