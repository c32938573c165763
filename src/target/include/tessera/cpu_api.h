// The entries of Tessera's CPU runtime that kernels call, declared: what tessera/cpu.h gives a kernel
// compiled against the runtime objects (TESSERA_CPU_RUNTIME_LINKED) instead of the definitions.
//
// Tessera's builds compile cpu_gemm.h (with cpu_amx.h), cpu_int8.h, cpu_conv.h and cpu_winograd.h
// once per flag set, an object each (tessera_tvm.target.cpu.build.runtime_link), and link the ones a
// kernel calls into its library, hidden there. Each object's translation unit includes this header
// before the definitions, so a declaration that no longer matches its definition fails that build.
#pragma once

#include <stdint.h>

#include "cpu_parallel.h"  // TESSERA_EXTERN_C

// TileLang's fp16 storage type in generated C (tl_templates/cpp/half.hpp): only its address is used.
namespace half_float {
class half;
}
using half_float::half;

// cpu_gemm.h: packing and the GEMM micro-kernels (fp32, and bf16 pairs)
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_f32(float *pack, float *a, int64_t offset, int64_t row_stride,
    int64_t k_stride, int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_b_f32(float *pack, float *b, int64_t offset, int64_t k_stride,
    int64_t col_stride, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_f16(float *pack, half *a, int64_t offset, int64_t row_stride,
    int64_t k_stride, int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_b_f16(float *pack, half *b, int64_t offset, int64_t k_stride,
    int64_t col_stride, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_bf16(float *pack, uint16_t *a, int64_t offset, int64_t row_stride,
    int64_t k_stride, int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_b_bf16(float *pack, uint16_t *b, int64_t offset, int64_t k_stride,
    int64_t col_stride, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_f32(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
    int32_t rows, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_set_f32(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
    int32_t rows, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_panel_f32(float *acc, int32_t acc_stride, float *a_pack, float *b,
    int64_t b_offset, int32_t strip, int32_t rows, int32_t cols, int32_t depth);
TESSERA_EXTERN_C void *tessera_cpu_workspace(int64_t floats, int64_t at);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_bf16x2(float *pack, uint16_t *a, int64_t offset, int64_t row_stride,
    int64_t k_stride, int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_b_bf16x2(float *pack, uint16_t *b, int64_t offset, int64_t k_stride,
    int64_t col_stride, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_bf16x2(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
    int32_t rows, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_bf16x2_rows(float *acc, int32_t acc_stride, uint16_t *a, int64_t offset,
    int64_t row_stride, float *b_pack, int32_t rows, int32_t cols, int32_t depth);

// cpu_int8.h: the int8 GEMM on k-quads
TESSERA_EXTERN_C int32_t tessera_cpu_pack_b_s8x4(float *pack, int8_t *b, int64_t offset, int64_t k_stride,
    int64_t col_stride, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_s8x4_rows(int32_t *acc, int32_t acc_stride, int8_t *a, int64_t offset,
    int64_t row_stride, float *b_pack, int32_t rows, int32_t cols, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_s8x4(float *block, int8_t *a, int64_t offset, int64_t row_stride,
    int64_t k_stride, int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_gemm_s8x4(int32_t *acc, int32_t acc_stride, float *block, float *b_pack,
    int32_t rows, int32_t cols, int32_t depth);

// cpu_amx.h: which tile unit the bf16 and int8 GEMMs run on
TESSERA_EXTERN_C int32_t tessera_cpu_amx_state(void);

// cpu_conv.h: the convolutions
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_conv_f32(float *pack, float *x, int64_t offset, int32_t row0, int32_t k0,
    int32_t rows, int32_t depth, int32_t C, int32_t H, int32_t W, int32_t OH, int32_t OW, int32_t R, int32_t S,
    int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t dh, int32_t dw);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_conv_f16(float *pack, half *x, int64_t offset, int32_t row0, int32_t k0,
    int32_t rows, int32_t depth, int32_t C, int32_t H, int32_t W, int32_t OH, int32_t OW, int32_t R, int32_t S,
    int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t dh, int32_t dw);
TESSERA_EXTERN_C int32_t tessera_cpu_pack_a_conv_bf16(float *pack, uint16_t *x, int64_t offset, int32_t row0,
    int32_t k0, int32_t rows, int32_t depth, int32_t C, int32_t H, int32_t W, int32_t OH, int32_t OW, int32_t R,
    int32_t S, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t dh, int32_t dw);
TESSERA_EXTERN_C int32_t tessera_cpu_depthwise_f32(float *acc, float *plane, float *w, int32_t R, int32_t S,
    int32_t OH, int32_t OW, int32_t PW, int32_t sh, int32_t sw, int32_t dh, int32_t dw);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_direct_f32(float *acc, int64_t acc_stride, float *a, int64_t a_offset,
    int64_t lda, float *xpad, int32_t k0, int32_t depth, int32_t channels, int32_t pixels, int64_t plane,
    int64_t phase_plane, int32_t Wp, int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t dh, int32_t dw,
    int32_t set);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_rows_f32(float *xpad, float *x, int64_t offset, int32_t channels, int32_t H,
    int32_t W, int32_t oh0, int64_t plane, int64_t phase_plane, int32_t Wp, int32_t R, int32_t S, int32_t sh,
    int32_t sw, int32_t dh, int32_t dw, int32_t top, int32_t left, int32_t slack);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_pack_w_f32(float *pack, float *w, int64_t offset, int64_t row_stride,
    int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_rows_f16(float *xpad, half *x, int64_t offset, int32_t channels, int32_t H,
    int32_t W, int32_t oh0, int64_t plane, int64_t phase_plane, int32_t Wp, int32_t R, int32_t S, int32_t sh,
    int32_t sw, int32_t dh, int32_t dw, int32_t top, int32_t left, int32_t slack);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_pack_w_f16(float *pack, half *w, int64_t offset, int64_t row_stride,
    int32_t rows, int32_t depth);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_rows_bf16(float *xpad, uint16_t *x, int64_t offset, int32_t channels,
    int32_t H, int32_t W, int32_t oh0, int64_t plane, int64_t phase_plane, int32_t Wp, int32_t R, int32_t S,
    int32_t sh, int32_t sw, int32_t dh, int32_t dw, int32_t top, int32_t left, int32_t slack);
TESSERA_EXTERN_C int32_t tessera_cpu_conv_pack_w_bf16(float *pack, uint16_t *w, int64_t offset, int64_t row_stride,
    int32_t rows, int32_t depth);

// cpu_winograd.h: the Winograd F(4x4, 3x3) convolution
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_weights_m4_f32(float *u, float *w, int64_t offset, int32_t C,
    int32_t channels);
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_m4_f32(float *acc, int64_t acc_stride, int32_t row_stride,
    float *workspace, int64_t floats, int64_t u_floats, float *x, int64_t offset, int32_t C, int32_t H, int32_t W,
    int32_t top, int32_t left, int32_t oh0, int32_t tile_rows, int32_t TW, int32_t channels);
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_weights_m4_f16(float *u, half *w, int64_t offset, int32_t C,
    int32_t channels);
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_m4_f16(float *acc, int64_t acc_stride, int32_t row_stride,
    float *workspace, int64_t floats, int64_t u_floats, half *x, int64_t offset, int32_t C, int32_t H, int32_t W,
    int32_t top, int32_t left, int32_t oh0, int32_t tile_rows, int32_t TW, int32_t channels);
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_weights_m4_bf16(float *u, uint16_t *w, int64_t offset, int32_t C,
    int32_t channels);
TESSERA_EXTERN_C int32_t tessera_cpu_winograd_m4_bf16(float *acc, int64_t acc_stride, int32_t row_stride,
    float *workspace, int64_t floats, int64_t u_floats, uint16_t *x, int64_t offset, int32_t C, int32_t H, int32_t W,
    int32_t top, int32_t left, int32_t oh0, int32_t tile_rows, int32_t TW, int32_t channels);
