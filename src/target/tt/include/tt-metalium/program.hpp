// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/program.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstdint>

namespace tt::tt_metal {

class Program {
public:
    Program();
    Program(const Program& other) = delete;
    Program& operator=(const Program& other) = delete;
    Program(Program&& other) noexcept;
    Program& operator=(Program&& other) noexcept;
    ~Program() noexcept;
    std::uint64_t get_id() const;
};

}  // namespace tt::tt_metal
