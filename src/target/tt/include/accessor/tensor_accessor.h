// Tessera's tt-metal v0.62.2 (2025-08-20) API: accessor/tensor_accessor.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// Only interleaved tensors are modelled (one compile-time arg: the ArgsConfig bits).
// Interleaved TensorAccessor: page i of a buffer lives in bank (i % banks) at
// bank_base_address + (i / banks) * aligned_page_size (the emulator owns the bank count/alignment).
#pragma once

#include <cstddef>
#include <cstdint>

#include "compile_time_args.h"
#include "hostdevcommon/tensor_accessor/arg_config.hpp"
#include "tt_emu/runtime_api.h"

template <std::size_t CTA_OFFSET, std::size_t CRTA_OFFSET = tensor_accessor::UNKNOWN>
struct TensorAccessorArgs {
    static constexpr auto args_config = tensor_accessor::ArgsConfig(
        static_cast<tensor_accessor::ArgsConfig::Underlying>(get_compile_time_arg_val(CTA_OFFSET)));
    static constexpr bool is_sharded = args_config.test(tensor_accessor::ArgConfig::Sharded);
    static constexpr bool is_dram = args_config.test(tensor_accessor::ArgConfig::IsDram);
    static_assert(!is_sharded, "the Tessera emulator models interleaved tensors only");

    constexpr TensorAccessorArgs() = default;
    constexpr explicit TensorAccessorArgs(std::uint32_t crta_offset) : crta_offset_rt_(crta_offset) {}

    static constexpr std::uint32_t num_compile_time_args() { return 1; }
    static constexpr std::uint32_t next_compile_time_args_offset() { return CTA_OFFSET + num_compile_time_args(); }
    constexpr std::uint32_t crta_offset() const { return crta_offset_rt_; }
    constexpr std::uint32_t num_common_runtime_args() const { return 0; }
    constexpr std::uint32_t next_common_runtime_args_offset() const { return crta_offset() + num_common_runtime_args(); }

private:
    std::uint32_t crta_offset_rt_ = 0;
};

template <typename DSpec>
struct TensorAccessor {
    template <std::size_t CTA, std::size_t CRTA>
    TensorAccessor(const TensorAccessorArgs<CTA, CRTA>&, std::size_t bank_base_address, std::uint32_t page_size)
        : page_size(page_size),
          bank_base_address_(static_cast<std::uint32_t>(bank_base_address)),
          is_dram_(TensorAccessorArgs<CTA, CRTA>::is_dram) {}

    std::uint64_t get_noc_addr(std::uint32_t page_id, std::uint32_t offset = 0, std::uint8_t /*noc*/ = 0) const {
        return tt_emu::interleaved_noc_addr(is_dram_, bank_base_address_, page_size, page_id, offset);
    }

    const std::uint32_t page_size;

private:
    std::uint32_t bank_base_address_;
    bool is_dram_;
};

template <std::size_t CTA, std::size_t CRTA>
TensorAccessor(const TensorAccessorArgs<CTA, CRTA>&, std::size_t, std::uint32_t)
    -> TensorAccessor<TensorAccessorArgs<CTA, CRTA>>;
