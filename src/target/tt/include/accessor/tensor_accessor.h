// Tessera stub of tt-metal v0.62.2 (2025-08-20): accessor/tensor_accessor.h
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
// Only interleaved tensors are modelled (one compile-time arg: the ArgsConfig bits).
#pragma once

#include <cstddef>
#include <cstdint>

#include "compile_time_args.h"
#include "hostdevcommon/tensor_accessor/arg_config.hpp"

template <std::size_t CTA_OFFSET, std::size_t CRTA_OFFSET = tensor_accessor::UNKNOWN>
struct TensorAccessorArgs {
    static constexpr auto args_config = tensor_accessor::ArgsConfig(
        static_cast<tensor_accessor::ArgsConfig::Underlying>(get_compile_time_arg_val(CTA_OFFSET)));
    static constexpr bool is_sharded = args_config.test(tensor_accessor::ArgConfig::Sharded);
    static constexpr bool is_dram = args_config.test(tensor_accessor::ArgConfig::IsDram);
    static_assert(!is_sharded, "Tessera's tt-metal stubs model interleaved tensors only");

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
    TensorAccessor(const TensorAccessorArgs<CTA, CRTA>& args, std::size_t bank_base_address, std::uint32_t page_size);

    std::uint64_t get_noc_addr(std::uint32_t page_id, std::uint32_t offset = 0, std::uint8_t noc = 0) const;

    const std::uint32_t page_size;
};

template <std::size_t CTA, std::size_t CRTA>
TensorAccessor(const TensorAccessorArgs<CTA, CRTA>&, std::size_t, std::uint32_t)
    -> TensorAccessor<TensorAccessorArgs<CTA, CRTA>>;
