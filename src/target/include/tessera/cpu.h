// Tessera's CPU runtime header: what generated CPU kernels (TVM target `c`, built with g++) call.
//
// The C source TileLang generates includes this file when a kernel uses it (tessera.ImportCpuRuntime
// adds the include). Everything here is header-only, as TileLang's C++ templates from tl_templates are
// for its GPU kernels: the tile program names these functions through T.call_extern (or ops whose
// global symbol is one of the macros below).
//
//   cpu_parallel.h  the kernel grid as an OpenMP parallel region (TESSERA_PARALLEL_BEGIN/END)
//   cpu_gemm.h      operand packing and the register-blocked GEMM micro-kernel
//   cpu_int8.h      the int8 GEMM on k-quads (AVX512-VNNI)
//   cpu_amx.h       the bf16 and int8 GEMMs' AMX tiles, where the CPU has them
//   cpu_conv.h      the convolutions: implicit GEMM packing, depthwise, direct
//   cpu_winograd.h  the Winograd F(4x4, 3x3) convolution's transforms
//   cpu_math.h      math g++ can vectorise (tessera_expf)
//   cpu_api.h       the declarations of the entries above that kernels call
//
// A kernel built by Tessera is compiled with TESSERA_CPU_RUNTIME_LINKED: cpu_parallel.h and cpu_math.h
// (inline in its loops) and cpu_api.h's declarations, the definitions coming from the runtime objects
// compiled once per flag set (tessera_tvm.target.cpu.build.runtime_link). Without the macro (a C++
// source of one's own, a test harness) everything here is inline and the header is self-contained.
#pragma once

#include "cpu_parallel.h"
#include "cpu_math.h"  // inline in the kernel's own loops, always
#if defined(TESSERA_CPU_RUNTIME_LINKED)
#include "cpu_api.h"  // the rest is in the runtime objects linked with the kernel
#else
#include "cpu_gemm.h"
#include "cpu_int8.h"
#include "cpu_conv.h"
#include "cpu_winograd.h"
#endif
