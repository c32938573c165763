// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt-metalium/core_coord.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <cstddef>
#include <set>
#include <vector>

struct CoreCoord {
    constexpr CoreCoord() : x(0), y(0) {}
    constexpr CoreCoord(std::size_t x, std::size_t y) : x(x), y(y) {}
    std::size_t x;
    std::size_t y;
};
bool operator==(const CoreCoord& a, const CoreCoord& b);
bool operator!=(const CoreCoord& a, const CoreCoord& b);
bool operator<(const CoreCoord& a, const CoreCoord& b);

class CoreRange {
public:
    CoreRange(const CoreCoord& point);
    CoreRange(const CoreCoord& start_coord, const CoreCoord& end_coord);
    std::size_t size() const;
    bool contains(const CoreCoord& other) const;
    CoreCoord grid_size() const;
    CoreCoord start_coord;
    CoreCoord end_coord;
};

class CoreRangeSet {
public:
    CoreRangeSet();
    CoreRangeSet(const CoreRange& core_range);
    CoreRangeSet(const std::set<CoreRange>& core_ranges);
    CoreRangeSet(const std::vector<CoreRange>& core_ranges);
    std::size_t num_cores() const;
    bool contains(const CoreCoord& other) const;
    const std::vector<CoreRange>& ranges() const;
};
bool operator<(const CoreRange& a, const CoreRange& b);

std::vector<CoreCoord> corerange_to_cores(
    const CoreRangeSet& crs, std::size_t max_cores = 0, bool row_wise = false);
