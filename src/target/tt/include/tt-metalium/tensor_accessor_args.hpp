// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/tensor_accessor_args.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hostdevcommon/tensor_accessor/arg_config.hpp"
#include "tt-metalium/buffer.hpp"

namespace tt::tt_metal {

// Host half of TensorAccessor: encodes how a buffer is laid out as kernel compile-time args.
class TensorAccessorArgs {
public:
    TensorAccessorArgs() = default;
    explicit TensorAccessorArgs(
        const Buffer& buffer, tensor_accessor::ArgsConfig args_config = tensor_accessor::ArgConfig::None);
    explicit TensorAccessorArgs(
        const std::shared_ptr<Buffer>& buffer, tensor_accessor::ArgsConfig args_config = tensor_accessor::ArgConfig::None);
    void append_to(std::vector<std::uint32_t>& compile_time_args) const;
    void append_to(std::vector<std::uint32_t>& compile_time_args, std::vector<std::uint32_t>& common_runtime_args) const;
    std::vector<std::uint32_t> get_compile_time_args() const;
    std::vector<std::uint32_t> get_common_runtime_args() const;
};

}  // namespace tt::tt_metal
