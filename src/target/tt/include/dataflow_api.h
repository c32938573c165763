// Tessera stub of tt-metal v0.62.2 (2025-08-20): dataflow_api.h (tt_metal/hw/inc/dataflow_api.h)
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// Data-movement kernels include this header and define `void kernel_main()`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "accessor/tensor_accessor.h"
#include "compile_time_args.h"
#include "hostdevcommon/kernel_structs.h"
#include "tensix_types.h"

#define FORCE_INLINE inline __attribute__((always_inline))
#define tt_l1_ptr
#define tt_reg_ptr

constexpr std::uint8_t noc_index = 0;

// ---- kernel arguments -------------------------------------------------------------------------
std::uint32_t get_arg_addr(int arg_idx);
std::uint32_t get_common_arg_addr(int arg_idx);
template <typename T>
T get_arg_val(int arg_idx);
template <typename T>
T get_common_arg_val(int arg_idx);

// ---- core coordinates -------------------------------------------------------------------------
std::uint8_t get_absolute_logical_x();
std::uint8_t get_absolute_logical_y();
std::uint8_t get_relative_logical_x();
std::uint8_t get_relative_logical_y();

// ---- circular buffers -------------------------------------------------------------------------
void cb_push_back(const std::int32_t operand, const std::int32_t num_pages);
void cb_pop_front(std::int32_t operand, std::int32_t num_pages);
void cb_reserve_back(std::int32_t operand, std::int32_t num_pages);
void cb_wait_front(std::int32_t operand, std::int32_t num_pages);
bool cb_pages_reservable_at_back(std::int32_t operand, std::int32_t num_pages);
bool cb_pages_available_at_front(std::int32_t operand, std::int32_t num_pages);
std::uint32_t get_write_ptr(std::uint32_t operand);
std::uint32_t get_read_ptr(std::uint32_t operand);
std::int32_t get_tile_size(const std::int32_t operand);
DataFormat get_dataformat(const std::int32_t operand);

// ---- NoC addresses ----------------------------------------------------------------------------
std::uint64_t get_noc_addr(std::uint32_t noc_x, std::uint32_t noc_y, std::uint32_t addr, std::uint8_t noc = noc_index);
std::uint64_t get_noc_addr(std::uint32_t addr, std::uint8_t noc = noc_index);
template <typename DSpec>
std::uint64_t get_noc_addr(
    const std::uint32_t id, const TensorAccessor<DSpec>& s, std::uint32_t offset = 0, std::uint8_t noc = noc_index);

// Interleaved address generator of earlier releases (still present in the pinned one).
template <bool DRAM, std::uint32_t tile_hw = 1024>
struct InterleavedAddrGenFast {
    std::uint32_t bank_base_address;
    std::uint32_t page_size;
    DataFormat data_format;
    std::uint64_t get_noc_addr(const std::uint32_t id, const std::uint32_t offset = 0, std::uint8_t noc = noc_index) const;
};

// ---- NoC transfers ----------------------------------------------------------------------------
void noc_async_read(std::uint64_t src_noc_addr, std::uint32_t dst_local_l1_addr, std::uint32_t size, std::uint8_t noc = noc_index);
void noc_async_write(std::uint32_t src_local_l1_addr, std::uint64_t dst_noc_addr, std::uint32_t size, std::uint8_t noc = noc_index);

template <typename DSpec>
void noc_async_read_tile(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index);
template <typename DSpec>
void noc_async_write_tile(
    const std::uint32_t id, const TensorAccessor<DSpec>& s, std::uint32_t src_local_l1_addr, std::uint8_t noc = noc_index);
template <typename DSpec>
void noc_async_read_page(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index);
template <typename DSpec>
void noc_async_write_page(
    const std::uint32_t id,
    const TensorAccessor<DSpec>& s,
    std::uint32_t src_local_l1_addr,
    const std::uint32_t write_size_bytes,
    const std::uint32_t offset = 0,
    std::uint8_t noc = noc_index);

template <bool DRAM, std::uint32_t tile_hw>
void noc_async_read_tile(
    const std::uint32_t id,
    const InterleavedAddrGenFast<DRAM, tile_hw>& s,
    std::uint32_t dst_local_l1_addr,
    std::uint32_t offset = 0,
    std::uint8_t noc = noc_index);
template <bool DRAM, std::uint32_t tile_hw>
void noc_async_write_tile(
    const std::uint32_t id,
    const InterleavedAddrGenFast<DRAM, tile_hw>& s,
    std::uint32_t src_local_l1_addr,
    std::uint8_t noc = noc_index);

void noc_async_read_barrier(std::uint8_t noc = noc_index);
void noc_async_write_barrier(std::uint8_t noc = noc_index);
void noc_async_writes_flushed(std::uint8_t noc = noc_index);
void noc_async_full_barrier(std::uint8_t noc = noc_index);
