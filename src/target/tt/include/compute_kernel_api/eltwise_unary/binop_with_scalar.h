// Tessera's tt-metal v0.62.2 (2025-08-20) API: compute_kernel_api/eltwise_unary/binop_with_scalar.h
// The pinned API's signatures, implemented for the emulator over tt_emu runtime calls.
// DST tile (op) scalar, in float32; the scalar is a float32 passed as its bit pattern (param1).
#pragma once

#include "compute_kernel_api/common_globals.h"

namespace ckernel {

ALWI void binop_with_scalar_tile_init() { tt_emu::sfpu_init(tt_emu::SFPU_BINOP_SCALAR, "binop_with_scalar_tile_init"); }
ALWI void add_unary_tile(std::uint32_t idst, std::uint32_t param1) {
    tt_emu::sfpu_scalar(tt_emu::SCALAR_ADD, idst, param1, "add_unary_tile");
}
ALWI void sub_unary_tile(std::uint32_t idst, std::uint32_t param1) {
    tt_emu::sfpu_scalar(tt_emu::SCALAR_SUB, idst, param1, "sub_unary_tile");
}
ALWI void mul_unary_tile(std::uint32_t idst, std::uint32_t param1) {
    tt_emu::sfpu_scalar(tt_emu::SCALAR_MUL, idst, param1, "mul_unary_tile");
}
ALWI void div_unary_tile(std::uint32_t idst, std::uint32_t param1) {
    tt_emu::sfpu_scalar(tt_emu::SCALAR_DIV, idst, param1, "div_unary_tile");
}
ALWI void rsub_unary_tile(std::uint32_t idst, std::uint32_t param1) {
    tt_emu::sfpu_scalar(tt_emu::SCALAR_RSUB, idst, param1, "rsub_unary_tile");
}

}  // namespace ckernel
