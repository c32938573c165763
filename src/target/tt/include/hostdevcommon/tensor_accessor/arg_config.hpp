// Tessera's tt-metal v0.62.2 (2025-08-20) API: hostdevcommon/tensor_accessor/arg_config.hpp
// No behaviour to emulate: the emulator and the syntax check use these definitions as they are.
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensor_accessor {

// Bits of the first compile-time argument a TensorAccessorArgs appends (host) and decodes (kernel).
enum class ArgConfig : std::uint8_t {
    None = 0,
    Sharded = 1 << 0,
    IsDram = 1 << 1,
    RuntimeRank = 1 << 2,
    RuntimeNumBanks = 1 << 3,
    RuntimeTensorShape = 1 << 4,
    RuntimeShardShape = 1 << 5,
    RuntimeBankCoords = 1 << 6,
};

struct ArgsConfig {
    using Underlying = std::uint8_t;
    constexpr ArgsConfig() : value(0) {}
    constexpr ArgsConfig(ArgConfig bit) : value(static_cast<Underlying>(bit)) {}
    constexpr explicit ArgsConfig(Underlying v) : value(v) {}
    constexpr bool test(ArgConfig bit) const { return (value & static_cast<Underlying>(bit)) != 0; }
    constexpr Underlying raw() const { return value; }
    Underlying value;
};

constexpr std::size_t UNKNOWN = static_cast<std::size_t>(-1);

}  // namespace tensor_accessor
