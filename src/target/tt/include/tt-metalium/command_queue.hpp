// Tessera stub of tt-metal v0.62.2 (2025-08-20): tt-metalium/command_queue.hpp
// Declarations only, for `g++ -std=c++17 -fsyntax-only`; mirrors the pinned API's names/signatures.
#pragma once

#include <cstdint>

namespace tt::tt_metal {

class IDevice;

class CommandQueue {
public:
    virtual ~CommandQueue() = default;
    virtual IDevice* device() = 0;
    virtual std::uint32_t id() const = 0;
};

}  // namespace tt::tt_metal
