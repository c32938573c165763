// Tessera's tt-metal v0.62.2 (2025-08-20) API: tt_stl/span.hpp
// Declarations only: host programs are syntax-checked, not built here (the emulator runs their plan).
// Mirrors the pinned API's names and signatures.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace tt::stl {

// Non-owning view (std::span-like) the host API takes runtime args as.
template <typename T>
class Span {
public:
    using element_type = T;
    using value_type = std::remove_cv_t<T>;
    constexpr Span() noexcept = default;
    constexpr Span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <typename U, typename A, typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    Span(const std::vector<U, A>& v) noexcept : data_(v.data()), size_(v.size()) {}
    template <typename U, typename A, typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    Span(std::vector<U, A>& v) noexcept : data_(v.data()), size_(v.size()) {}
    template <typename U, std::size_t N, typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    constexpr Span(std::array<U, N>& a) noexcept : data_(a.data()), size_(N) {}
    constexpr T* data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr T* begin() const noexcept { return data_; }
    constexpr T* end() const noexcept { return data_ + size_; }
    constexpr T& operator[](std::size_t i) const { return data_[i]; }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace tt::stl
