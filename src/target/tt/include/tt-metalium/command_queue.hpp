// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/command_queue.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
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
