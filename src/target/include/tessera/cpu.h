// Tessera's CPU runtime header: what generated CPU kernels (TVM target `c`, built with g++) call.
//
// The C source TileLang generates includes this file when a kernel uses it (tessera.ImportCpuRuntime
// adds the include). Everything here is header-only and compiled with the kernel, the way TileLang's
// GPU kernels call C++ templates from tl_templates: the tile program names these functions through
// T.call_extern (or ops whose global symbol is one of the macros below).
//
//   cpu_parallel.h  the kernel grid as an OpenMP parallel region (TESSERA_PARALLEL_BEGIN/END)
//   cpu_gemm.h      operand packing and the register-blocked GEMM micro-kernel
//   cpu_int8.h      the int8 GEMM on k-quads (AVX512-VNNI)
//   cpu_amx.h       the bf16 and int8 GEMMs' AMX tiles, where the CPU has them
//   cpu_conv.h      the convolutions: implicit GEMM packing, depthwise, direct
//   cpu_winograd.h  the Winograd F(4x4, 3x3) convolution's transforms
//   cpu_math.h      math g++ can vectorise (tessera_expf)
#pragma once

#include "cpu_parallel.h"
#include "cpu_gemm.h"
#include "cpu_int8.h"
#include "cpu_conv.h"
#include "cpu_winograd.h"
#include "cpu_math.h"
