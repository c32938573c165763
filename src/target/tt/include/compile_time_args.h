// Tessera's tt-metal v0.62.2 (2025-08-20) API: compile_time_args.h
// No behaviour to emulate: the emulator and the syntax check use these definitions as they are.
// Mirrors the pinned API's names and signatures.
//
// The kernel build passes the kernel's compile-time args as -DKERNEL_COMPILE_TIME_ARGS=a,b,c; they
// are usable in constant expressions (TensorAccessorArgs<N> indexes them at compile time).
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef KERNEL_COMPILE_TIME_ARGS
constexpr std::uint32_t kernel_compile_time_args[] = {KERNEL_COMPILE_TIME_ARGS};
constexpr std::size_t kernel_compile_time_args_count = sizeof(kernel_compile_time_args) / sizeof(std::uint32_t);
#else
constexpr std::uint32_t kernel_compile_time_args[1] = {0};
constexpr std::size_t kernel_compile_time_args_count = 0;
#endif

constexpr std::uint32_t tt_compile_time_arg_checked(std::size_t idx) {
    // Out-of-range indices are not constant expressions: the kernel fails to compile.
    return idx < kernel_compile_time_args_count ? kernel_compile_time_args[idx]
                                                : throw "get_compile_time_arg_val: index out of range";
}

#define get_compile_time_arg_val(arg_idx) tt_compile_time_arg_checked(arg_idx)
