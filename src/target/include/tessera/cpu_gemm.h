// Operand packing and the register-blocked GEMM micro-kernel of Tessera's CPU GEMM tile program.
//
// The CPU analogue of TileLang's tl::gemm_ss templates. A GEMM block computes a block_m x block_n
// fp32 accumulator tile; for each K step of block_k the tile program (tessera_tvm/tile/gemm.py) calls
//
//   tessera_cpu_pack_a_<dtype>(a_pack, A, offset of A[row0, k0], row_stride, k_stride, rows, depth)
//   tessera_cpu_pack_b_<dtype>(b_pack, B, offset of B[k0, col0], k_stride, col_stride, cols, depth)
//   tessera_cpu_gemm_f32(acc, acc_stride, a_pack, b_pack, rows, cols, depth)     // acc += A * B
//   tessera_cpu_gemm_set_f32(acc, acc_stride, a_pack, b_pack, rows, cols, depth) // acc = A * B
//
// or, for a B packed ahead (a constant weight), no B packing and
//
//   tessera_cpu_gemm_panel_f32(acc, acc_stride, a_pack, B, offset of the panel, strip, rows, cols, depth)
//
// Packing copies the operands into the order the micro-kernel reads them, converting fp16/bf16 to
// fp32 on the way; transposed operands are packed through their strides. A is packed as strips of
// TESSERA_GEMM_MR rows (element (k, r) of a strip at k * MR + r), B as strips of TESSERA_GEMM_NR
// columns (element (k, c) at k * NR + c); the last strip is zero-padded, so the packed buffers need
// round_up(rows, MR) * depth and round_up(cols, NR) * depth floats (the tile program allocates
// (block + TESSERA_GEMM_PAD) * block_k). The micro-kernel keeps an MR x NR tile of the accumulator in
// vector registers for the whole depth: per k it loads NR/VEC vectors of B and broadcasts MR
// elements of A, MR * NR/VEC fused multiply-adds. Edge tiles compute the full register tile and
// add only the rows/columns inside the block. bf16 x bf16 GEMMs use the `bf16x2` entries at the end
// of this file instead: k-pairs for the CPU's bf16 dot products.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#if defined(__F16C__) || defined(__AVX__)
#include <immintrin.h>
#endif

// TileLang's fp16 storage type in generated C (tl_templates/cpp/half.hpp); only its address is used
// here, so a declaration suffices and this header does not need TileLang's include path.
namespace half_float {
class half;
}
using half_float::half;

#include "cpu_amx.h"       // the tile unit of the bf16 GEMM where the CPU has AMX
#include "cpu_parallel.h"  // TESSERA_EXTERN_C

#if defined(__AVX512F__)
#define TESSERA_GEMM_VEC 16  // fp32 lanes of a vector register
#define TESSERA_GEMM_MR 14   // 14 x 2 accumulators + 2 B vectors + 1 broadcast of the 32 zmm registers
#define TESSERA_GEMM_NV 2
#elif defined(__AVX__)
#define TESSERA_GEMM_VEC 8
#define TESSERA_GEMM_MR 6  // 6 x 2 accumulators of the 16 ymm registers
#define TESSERA_GEMM_NV 2
#else
#define TESSERA_GEMM_VEC 4
#define TESSERA_GEMM_MR 4
#define TESSERA_GEMM_NV 2
#endif
#define TESSERA_GEMM_NR (TESSERA_GEMM_VEC * TESSERA_GEMM_NV)

// Rows/columns the tile program adds to block_m/block_n when it sizes the packed buffers; must be at
// least MR - 1 and NR - 1 (tessera_tvm/tile/gemm.py: CPU_PACK_PAD).
#define TESSERA_GEMM_PAD 64
static_assert(TESSERA_GEMM_MR - 1 <= TESSERA_GEMM_PAD && TESSERA_GEMM_NR - 1 <= TESSERA_GEMM_PAD,
              "the packed buffers the tile program allocates are too small for this micro-tile");

typedef float tessera_vf __attribute__((vector_size(TESSERA_GEMM_VEC * sizeof(float))));
// The same vector at 4-byte alignment: loads and stores through it need not be vector-aligned.
typedef float tessera_vf_unaligned
    __attribute__((vector_size(TESSERA_GEMM_VEC * sizeof(float)), aligned(sizeof(float))));

// ------------------------------------------------------------------------------------ conversions

static inline float tessera_to_float(float x) { return x; }

// bf16 is the upper half of an fp32 (C has no bf16 type: the codegen passes bf16 storage as uint16_t).
static inline float tessera_to_float(uint16_t bits) {
  uint32_t wide = (uint32_t)bits << 16;
  float x;
  memcpy(&x, &wide, sizeof x);
  return x;
}

struct tessera_half_bits {  // fp16 storage (TileLang's `half`), converted by value
  uint16_t bits;
};

static inline float tessera_to_float(tessera_half_bits h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16, exponent = (h.bits >> 10) & 0x1fu, mantissa = h.bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1fu) {  // inf / nan
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    wide = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float x;
  memcpy(&x, &wide, sizeof x);
  return x;
#endif
}

// ------------------------------------------------------------------------------------ packing

#if defined(__AVX512F__)
// 16 x 16 transpose of 32-bit lanes: row r of `m` becomes lane r of every row.
static inline void tessera_transpose_16x16(__m512i m[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(m[i], m[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(m[i], m[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    m[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    m[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    m[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    m[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // m[4q + j], 128-bit lane l: element 4l + j of rows 4q..4q+3; gather each element's four lanes.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(m[i], m[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(m[i], m[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(m[i + 8], m[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(m[i + 8], m[i + 12], 0xdd);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    m[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    m[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    m[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    m[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// fp32 strips whose elements are contiguous in k (A row-major, B as a linear layer's [N, K] weight):
// strip[k * W + i] = base[i * stride + k] for the W elements of a full strip. 16 k of 16 elements
// are loaded as rows, transposed in registers and stored k-major (masked to the strip's W lanes),
// where the scalar loop read one element per row and k (a linear's GEMM ran at 0.83-0.88x of the
// same GEMM with B [K, N]).
template <int W>
static inline void tessera_pack_f32_transpose(float *__restrict strip, const float *__restrict base, int64_t stride,
                                              int32_t depth) {
  int32_t k0 = 0;
  for (; k0 + 16 <= depth; k0 += 16) {
#pragma GCC unroll 2
    for (int i0 = 0; i0 < W; i0 += 16) {
      const int n = W - i0 < 16 ? W - i0 : 16;
      __m512i m[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        m[i] = i < n ? _mm512_castps_si512(_mm512_loadu_ps(base + (int64_t)(i0 + i) * stride + k0)) : _mm512_setzero_si512();
      }
      tessera_transpose_16x16(m);
      const __mmask16 lanes = (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        _mm512_mask_storeu_ps(strip + (int64_t)(k0 + k) * W + i0, lanes, _mm512_castsi512_ps(m[k]));
      }
    }
  }
  for (; k0 < depth; ++k0) {
    for (int i = 0; i < W; ++i) {
      strip[(int64_t)k0 * W + i] = base[(int64_t)i * stride + k0];
    }
  }
}
#endif

// pack[strip][k][i] = element (i of the strip, k) of an operand whose element (i, k) is at
// src[i * stride + k * k_stride]: A in strips of W = MR rows, B in strips of W = NR columns.
template <int W, typename T>
static inline void tessera_pack_strips(float *__restrict pack, const T *__restrict src, int64_t stride,
                                       int64_t k_stride, int32_t count, int32_t depth) {
  for (int32_t i0 = 0; i0 < count; i0 += W) {
    float *strip = pack + (int64_t)i0 * depth;
    const T *base = src + i0 * stride;
    const int32_t live = count - i0 < W ? count - i0 : W;
    if (live == W && stride == 1) {
      // The strip is contiguous: one straight copy per k.
      for (int32_t k = 0; k < depth; ++k) {
        for (int i = 0; i < W; ++i) {
          strip[(int64_t)k * W + i] = tessera_to_float(base[k * k_stride + i]);
        }
      }
      continue;
    }
    if (live == W && k_stride == 1) {
      // Each row (A) or column (B) is contiguous in k: read W of them side by side, write k-major.
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        tessera_pack_f32_transpose<W>(strip, reinterpret_cast<const float *>(base), stride, depth);
        continue;
      }
#endif
      for (int32_t k = 0; k < depth; ++k) {
        for (int i = 0; i < W; ++i) {
          strip[(int64_t)k * W + i] = tessera_to_float(base[i * stride + k]);
        }
      }
      continue;
    }
    for (int32_t k = 0; k < depth; ++k) {
      float *dst = strip + (int64_t)k * W;
      int i = 0;
      for (; i < live; ++i) {
        dst[i] = tessera_to_float(base[i * stride + k * k_stride]);
      }
      for (; i < W; ++i) {
        dst[i] = 0.0f;
      }
    }
  }
}

// ------------------------------------------------------------------------------------ micro-kernel

// c[0:rows, 0:cols] += (Set: =) the first rows x cols of an R x NR register tile `sum` (an edge tile).
template <bool Set, int R>
static inline void tessera_add_edge_tile(float *__restrict c, int64_t ldc, const void *sum, int32_t rows,
                                         int32_t cols) {
  float tile[R][TESSERA_GEMM_NR];
  memcpy(tile, sum, sizeof tile);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      c[r * ldc + j] = Set ? tile[r][j] : c[r * ldc + j] + tile[r][j];
    }
  }
}

// c[0:rows, 0:cols] += a_strip * b_strip over `depth` (Set: c = the product, c not read) for the
// first R rows of an A strip packed MR rows wide, c with row stride `ldc` (rows <= R, cols <= NR).
template <bool Set, int R>
static inline void tessera_gemm_micro_rows(const float *__restrict a, const float *__restrict b, int32_t depth,
                                           float *__restrict c, int64_t ldc, int32_t rows, int32_t cols) {
  const int MR = TESSERA_GEMM_MR, NV = TESSERA_GEMM_NV, VEC = TESSERA_GEMM_VEC;
  tessera_vf sum[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      sum[r][v] = (tessera_vf){};
    }
  }
  for (int32_t k = 0; k < depth; ++k) {
    tessera_vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      bv[v] = *(const tessera_vf_unaligned *)(b + (int64_t)k * NV * VEC + v * VEC);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = a[(int64_t)k * MR + r];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        sum[r][v] += x * bv[v];
      }
    }
  }
  if (rows == R && cols == NV * VEC) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        tessera_vf_unaligned *dst = (tessera_vf_unaligned *)(c + r * ldc + v * VEC);
        *dst = Set ? sum[r][v] : *dst + sum[r][v];
      }
    }
    return;
  }
  tessera_add_edge_tile<Set, R>(c, ldc, sum, rows, cols);
}

// The micro-kernel over an MR x NR tile of which `rows` x `cols` are live. A tile of 8 rows or fewer
// (the bottom edge) runs a register tile of 4 or 8 rows: the whole tile spent the time of MR rows on
// them (M = 64 with MR = 14 took as long as M = 70, M = 128 as 140). Two sizes, not one per row
// count: each is code that every GEMM kernel's g++ compiles.
template <bool Set>
static inline void tessera_gemm_micro(const float *__restrict a, const float *__restrict b, int32_t depth,
                                      float *__restrict c, int64_t ldc, int32_t rows, int32_t cols) {
#if TESSERA_GEMM_MR > 8  // AVX-512's 14 rows (AVX's 6 and SSE's 4 have no narrower tile)
  if (rows <= 4) {
    tessera_gemm_micro_rows<Set, 4>(a, b, depth, c, ldc, rows, cols);
    return;
  }
  if (rows <= 8) {
    tessera_gemm_micro_rows<Set, 8>(a, b, depth, c, ldc, rows, cols);
    return;
  }
#endif
  tessera_gemm_micro_rows<Set, TESSERA_GEMM_MR>(a, b, depth, c, ldc, rows, cols);
}

// acc[0:rows, 0:cols] += A * B from packed strips, `steps` k steps deep (k, or k-pairs for bf16x2):
// Micro over every MR x NR tile. P is the packed element (float, or uint32_t for a bf16 pair).
template <typename P, void (*Micro)(const P *, const P *, int32_t, float *, int64_t, int32_t, int32_t)>
static inline void tessera_gemm_strips(float *acc, int64_t acc_stride, const P *a_pack, const P *b_pack, int32_t rows,
                                       int32_t cols, int32_t steps) {
  const int MR = TESSERA_GEMM_MR, NR = TESSERA_GEMM_NR;
  for (int32_t j = 0; j < cols; j += NR) {
    const int32_t live_cols = cols - j < NR ? cols - j : NR;
    for (int32_t i = 0; i < rows; i += MR) {
      const int32_t live_rows = rows - i < MR ? rows - i : MR;
      Micro(a_pack + (int64_t)i * steps, b_pack + (int64_t)j * steps, steps, acc + i * acc_stride + j, acc_stride,
            live_rows, live_cols);
    }
  }
}

// ------------------------------------------------------------------------------------ entry points
// Called from the tile program through T.call_extern; the codegen declares them from the call's
// argument types (float*, half*, uint16_t* for bf16, int32_t, int64_t), so these signatures must
// match. The operand comes as (base pointer, element offset): the address of a bf16 element would be
// retyped as fp32 by tirx.BF16ComputeLegalize. Offset and strides are int64_t: an operand may hold
// 2^31 elements or more (tessera_tvm/tile/common.py: element_offset).

#define TESSERA_DEFINE_PACK(SUFFIX, T, STORAGE)                                                             \
  TESSERA_CPU_API int32_t tessera_cpu_pack_a_##SUFFIX(float *pack, T *a, int64_t offset,                \
                                                              int64_t row_stride, int64_t k_stride, int32_t rows, \
                                                              int32_t depth) {                                   \
    tessera_pack_strips<TESSERA_GEMM_MR>(pack, (const STORAGE *)a + offset, row_stride, k_stride, rows, depth);                       \
    return 0;                                                                                                    \
  }                                                                                                              \
  TESSERA_CPU_API int32_t tessera_cpu_pack_b_##SUFFIX(float *pack, T *b, int64_t offset,                \
                                                              int64_t k_stride, int64_t col_stride, int32_t cols, \
                                                              int32_t depth) {                                   \
    tessera_pack_strips<TESSERA_GEMM_NR>(pack, (const STORAGE *)b + offset, col_stride, k_stride, cols, depth);                       \
    return 0;                                                                                                    \
  }

TESSERA_DEFINE_PACK(f32, float, float)
TESSERA_DEFINE_PACK(f16, half, tessera_half_bits)  // TileLang's `half`: 16 bits of fp16 storage
TESSERA_DEFINE_PACK(bf16, uint16_t, uint16_t)      // bf16 storage after tirx.BF16StorageLegalize
#undef TESSERA_DEFINE_PACK

TESSERA_CPU_API int32_t tessera_cpu_gemm_f32(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
                                                     int32_t rows, int32_t cols, int32_t depth) {
  tessera_gemm_strips<float, tessera_gemm_micro<false>>(acc, acc_stride, a_pack, b_pack, rows, cols, depth);
  return 0;
}

// acc[0:rows, 0:cols] = A * B: as tessera_cpu_gemm_f32 without reading acc (nothing to clear first).
TESSERA_CPU_API int32_t tessera_cpu_gemm_set_f32(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
                                                         int32_t rows, int32_t cols, int32_t depth) {
  tessera_gemm_strips<float, tessera_gemm_micro<true>>(acc, acc_stride, a_pack, b_pack, rows, cols, depth);
  return 0;
}

// acc[0:rows, 0:cols] += A * B, A packed by tessera_cpu_pack_a_*, B a panel packed ahead (a constant
// weight, packed when the module was built: tessera_tvm/tile/panels.py) at b + b_offset, in strips of
// `strip` columns laid out as tessera_pack_strips writes them. A panel packed for another strip width
// than this build's NR (a module built for another CPU) is repacked into NR strips first.
TESSERA_CPU_API int32_t tessera_cpu_gemm_panel_f32(float *acc, int32_t acc_stride, float *a_pack, float *b,
                                                           int64_t b_offset, int32_t strip, int32_t rows,
                                                           int32_t cols, int32_t depth) {
  const float *panel = b + b_offset;
  const int NR = TESSERA_GEMM_NR;
  if (strip == NR) {
    tessera_gemm_strips<float, tessera_gemm_micro<false>>(acc, acc_stride, a_pack, panel, rows, cols, depth);
    return 0;
  }
  const int32_t padded = (cols + NR - 1) / NR * NR;
  float *repacked = (float *)malloc(sizeof(float) * (size_t)padded * (size_t)depth);
  if (repacked == nullptr) {
    return -1;
  }
  for (int32_t c = 0; c < padded; ++c) {
    const float *from = panel + (int64_t)(c / strip) * strip * depth + c % strip;
    float *to = repacked + (int64_t)(c / NR) * NR * depth + c % NR;
    for (int32_t k = 0; k < depth; ++k) {
      to[(int64_t)k * NR] = c < cols ? from[(int64_t)k * strip] : 0.0f;
    }
  }
  tessera_gemm_strips<float, tessera_gemm_micro<false>>(acc, acc_stride, a_pack, repacked, rows, cols, depth);
  free(repacked);
  return 0;
}

// ------------------------------------------------------------------------------------ workspace
// Packed panels a block keeps for longer than one step and that would not fit its stack arrays (CPU
// attention packs a kv head's K and V once for all its query blocks: 1 MiB at 2048 keys of D=64). One
// buffer per thread (the grid's blocks run on a thread one after another), grown on demand and kept
// for the next block and call; freed when the thread exits. 64-byte aligned. Out of memory aborts:
// a kernel has no error path.
struct tessera_thread_buffer {
  void *data = nullptr;
  int64_t bytes = 0;
  ~tessera_thread_buffer() { free(data); }
};

// The address of float `at` of this thread's workspace, grown first to hold `floats` floats. The tile
// program asks for each panel's address (a pointer per panel, not one indexed by a large stride: the
// index's stride became a vector width in tl.StorageRewrite, which fails past 32767 lanes).
TESSERA_CPU_API void *tessera_cpu_workspace(int64_t floats, int64_t at) {
  static thread_local tessera_thread_buffer buffer;
  const int64_t bytes = floats * (int64_t)sizeof(float);
  if (bytes > buffer.bytes) {
    const int64_t rounded = (bytes + 4095) / 4096 * 4096;  // aligned_alloc wants a multiple of the alignment
    free(buffer.data);
    buffer.data = aligned_alloc(64, (size_t)rounded);
    if (buffer.data == nullptr) {
      fprintf(stderr, "tessera: out of memory for a %lld-byte kernel workspace\n", (long long)bytes);
      abort();
    }
    buffer.bytes = rounded;
  }
  return (float *)buffer.data + at;
}

// ------------------------------------------------------------------------------------ bf16 pairs
// bf16 x bf16 GEMMs: with AVX512-BF16 the micro-kernel runs vdpbf16ps on pairs of consecutive k: per
// pair, MR x NV dot products of pairs accumulated in fp32 (the CPU's rounding: round to nearest even,
// bf16 denormals read as zero). B is packed as pairs (element pair (p, c) of a B strip at p * NR + c
// holds B[2p, c] in its low and B[2p + 1, c] in its high 16 bits; an odd depth pads the last pair with
// zero). A row-major A is read in place: a pair is one 32-bit word of its row, broadcast from memory
// (packing A cost 4-5% of a 1024^3 GEMM); a transposed A is packed as pairs in strips of MR rows
// (pair (p, r) at p * MR + r). The register tile is 6 rows x 4 vectors (oneDNN's brgemm shape): 6 rows
// read in place stay clear of the L1 set conflicts that 14 rows 4 KiB apart (K = 2048) hit. The
// panels take half the floats of the fp32 packing. Without AVX512-BF16 the same entries run fp32.

#define TESSERA_PAIRS_MR 6  // 6 x 4 accumulators + 4 B vectors + 1 broadcast of the 32 zmm registers
#define TESSERA_PAIRS_NV 4
#define TESSERA_PAIRS_NR (TESSERA_PAIRS_NV * 16)
static_assert(TESSERA_PAIRS_MR - 1 <= TESSERA_GEMM_PAD && TESSERA_PAIRS_NR - 1 <= TESSERA_GEMM_PAD,
              "the packed buffers the tile program allocates are too small for the pairs' micro-tile");

#if defined(__AVX512BF16__) && defined(__AVX512F__) && TESSERA_GEMM_VEC == 16

static inline uint32_t tessera_bf16_pair(const uint16_t *p, int64_t stride, int32_t k, int32_t depth) {
  const uint32_t lo = p[(int64_t)k * stride];
  const uint32_t hi = k + 1 < depth ? p[(int64_t)(k + 1) * stride] : 0u;
  return lo | (hi << 16);
}

#define TESSERA_PACK_AHEAD 4  // k-pairs the row packer prefetches ahead (best of 1, 2, 4, 8 at 2048^3)

// The lanes [0, n) of a mask (n <= 32).
static inline uint32_t tessera_lanes(int32_t n) { return n >= 32 ? 0xffffffffu : (1u << n) - 1u; }

// Prefetch `bytes` from `p` into L1: the packers read operand rows that are a page or more apart
// (a cache and TLB miss each), so they ask for the rows they read next while packing these.
static inline void tessera_prefetch_row(const uint16_t *p, int64_t bytes) {
  for (int64_t offset = 0; offset < bytes + 63; offset += 64) {
    _mm_prefetch((const char *)p + offset, _MM_HINT_T0);
  }
}

// Strip elements contiguous in memory (stride 1), k-pairs from two k rows: element i of pair p holds
// src[i + 2p * k_stride] low and src[i + (2p + 1) * k_stride] high. The rows are read left to right
// across all strips (one stream per k row for the prefetcher); masked loads read only the `count`
// elements and the k rows inside `depth` (the rest reads as zero), so nothing past the block is touched.
template <int W>
static inline void tessera_pack_pairs_rows(uint32_t *__restrict pack, const uint16_t *__restrict src, int64_t k_stride,
                                           int32_t count, int32_t depth) {
  // vpermt2w picks lane i of the low row, then lane i of the high row: 32 pairs per two loads.
  const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                         5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
  const int32_t pairs = (depth + 1) / 2;
  for (int32_t p = 0; p < pairs; ++p) {
    const uint16_t *lo_row = src + (int64_t)2 * p * k_stride;
    const bool has_hi = 2 * p + 1 < depth;
    for (int32_t ahead = 2 * (p + TESSERA_PACK_AHEAD); ahead < 2 * (p + TESSERA_PACK_AHEAD + 1) && ahead < depth;
         ++ahead) {
      tessera_prefetch_row(src + ahead * k_stride, (int64_t)count * 2);
    }
    for (int32_t i0 = 0; i0 < count; i0 += W) {
      uint32_t *dst = pack + (int64_t)i0 * pairs + (int64_t)p * W;
#pragma GCC unroll 2
      for (int g = 0; g < W; g += 32) {
        const int lanes = W - g < 32 ? W - g : 32;
        const __mmask32 load = (__mmask32)tessera_lanes(count - i0 - g > 0 ? count - i0 - g : 0);
        const __m512i lo = _mm512_maskz_loadu_epi16(load, lo_row + i0 + g);
        const __m512i hi = has_hi ? _mm512_maskz_loadu_epi16(load, lo_row + k_stride + i0 + g) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + g, (__mmask16)tessera_lanes(lanes), _mm512_permutex2var_epi16(lo, first, hi));
        if (lanes > 16) {
          _mm512_mask_storeu_epi32(dst + g + 16, (__mmask16)tessera_lanes(lanes - 16),
                                   _mm512_permutex2var_epi16(lo, second, hi));
        }
      }
    }
  }
}

// Strip elements contiguous in k (k_stride 1): a k-pair is one 32-bit word of the element's row.
// 16 elements x 16 pairs are loaded as rows (masked to `live` elements and `depth`), transposed,
// and stored pair-major.
template <int W>
static inline void tessera_pack_pairs_transpose(uint32_t *__restrict strip, const uint16_t *__restrict base,
                                                int64_t stride, int32_t live, int32_t depth) {
  const int32_t pairs = (depth + 1) / 2;
  for (int32_t p0 = 0; p0 < pairs; p0 += 16) {
    const __mmask32 load = (__mmask32)tessera_lanes(depth - 2 * p0);
    const int32_t count = pairs - p0 < 16 ? pairs - p0 : 16;
#pragma GCC unroll 2
    for (int g = 0; g < W; g += 16) {
      const int lanes = W - g < 16 ? W - g : 16;
      __m512i m[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        m[r] = r < lanes && g + r < live ? _mm512_maskz_loadu_epi16(load, base + (g + r) * stride + 2 * p0)
                                         : _mm512_setzero_si512();
      }
      tessera_transpose_16x16(m);
      for (int32_t q = 0; q < count; ++q) {
        _mm512_mask_storeu_epi32(strip + (int64_t)(p0 + q) * W + g, (__mmask16)tessera_lanes(lanes), m[q]);
      }
    }
  }
}

// pack[strip][p][i] = the k-pair (2p, 2p + 1) of element i of the strip, the operand laid out as for
// tessera_pack_strips.
template <int W>
static inline void tessera_pack_pairs(uint32_t *__restrict pack, const uint16_t *__restrict src, int64_t stride,
                                      int64_t k_stride, int32_t count, int32_t depth) {
  if (stride == 1) {
    tessera_pack_pairs_rows<W>(pack, src, k_stride, count, depth);
    return;
  }
  const int32_t pairs = (depth + 1) / 2;
  for (int32_t i0 = 0; i0 < count; i0 += W) {
    uint32_t *strip = pack + (int64_t)i0 * pairs;
    const int32_t live = count - i0 < W ? count - i0 : W;
    if (k_stride == 1) {
      for (int32_t ahead = i0 + W; ahead < i0 + 2 * W && ahead < count; ++ahead) {  // the next strip's rows
        tessera_prefetch_row(src + ahead * stride, (int64_t)depth * 2);
      }
      tessera_pack_pairs_transpose<W>(strip, src + (int64_t)i0 * stride, stride, live, depth);
      continue;
    }
    for (int32_t p = 0; p < pairs; ++p) {
      uint32_t *dst = strip + (int64_t)p * W;
      int i = 0;
      for (; i < live; ++i) {
        dst[i] = tessera_bf16_pair(src + (int64_t)(i0 + i) * stride, k_stride, 2 * p, depth);
      }
      for (; i < W; ++i) {
        dst[i] = 0u;
      }
    }
  }
}

// The 32-bit word at `p` (2-byte aligned: a k-pair of a bf16 row).
static inline uint32_t tessera_load_pair(const uint16_t *p) {
  uint32_t word;
  memcpy(&word, p, sizeof word);
  return word;
}

// c[0:R, 0:cols] += A x B over `pairs` k-pairs, then with `odd` one last k alone (its pair's high half
// zero). A: R rows of bf16 at `a` with row stride `lda` (Packed: a strip, pair (p, r) at word
// p * MR + r). B: a packed strip of NR columns, zero past `cols`.
template <int R, bool Packed>
static inline void tessera_gemm_micro_pairs(const uint16_t *__restrict a, int64_t lda, const uint32_t *__restrict b,
                                            int32_t pairs, bool odd, float *__restrict c, int64_t ldc, int32_t cols) {
  const int MR = TESSERA_PAIRS_MR, NV = TESSERA_PAIRS_NV, VEC = 16;
  __m512 sum[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      sum[r][v] = _mm512_setzero_ps();
    }
  }
  // One k-pair step; `word(r)` is row r's pair.
  auto step = [&](int32_t p, auto word) __attribute__((always_inline)) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512((const void *)(b + (int64_t)p * NV * VEC + v * VEC));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32((int)word(r));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        sum[r][v] = _mm512_dpbf16_ps(sum[r][v], x, bv[v]);
      }
    }
  };
  for (int32_t p = 0; p < pairs; ++p) {
    step(p, [&](int r) __attribute__((always_inline)) {
      return tessera_load_pair(Packed ? a + 2 * ((int64_t)p * MR + r) : a + r * lda + 2 * p);
    });
  }
  if (odd) {  // the last k alone: its row may end there
    step(pairs, [&](int r) __attribute__((always_inline)) { return (uint32_t)a[r * lda + 2 * pairs]; });
  }
  if (cols == NV * VEC) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float *dst = c + r * ldc + v * VEC;
        _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), sum[r][v]));
      }
    }
    return;
  }
  // An edge tile: masked vector adds of its live columns (skinny GEMMs have many of them).
  __mmask16 live[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int32_t lanes = cols - v * VEC;
    live[v] = (__mmask16)tessera_lanes(lanes < 0 ? 0 : lanes);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float *dst = c + r * ldc + v * VEC;
      _mm512_mask_storeu_ps(dst, live[v], _mm512_add_ps(_mm512_maskz_loadu_ps(live[v], dst), sum[r][v]));
    }
  }
}

// acc[0:rows, 0:cols] += A x B over `depth` from k-pair `first` on (0 for a packed A): the micro-kernel
// over every MR x NR tile, a register tile of the live rows only at the bottom edge. A: row-major bf16
// at `a` with row stride `lda` (Packed: strips of MR rows packed as pairs), B: strips of NR columns
// packed as pairs.
template <bool Packed>
static inline void tessera_gemm_pairs(float *acc, int64_t acc_stride, const uint16_t *a, int64_t lda,
                                      const uint32_t *b_pack, int32_t rows, int32_t cols, int32_t depth,
                                      int32_t first = 0) {
  const int MR = TESSERA_PAIRS_MR, NR = TESSERA_PAIRS_NR;
  const int32_t steps = (depth + 1) / 2;  // pairs of a packed strip, the last one padded for an odd depth
  const int32_t pairs = Packed ? steps : depth / 2 - first;
  const bool odd = !Packed && depth % 2;
  for (int32_t j = 0; j < cols; j += NR) {
    const int32_t live_cols = cols - j < NR ? cols - j : NR;
    const uint32_t *b = b_pack + (int64_t)j * steps + (int64_t)first * NR;
    for (int32_t i = 0; i < rows; i += MR) {
      const uint16_t *strip = Packed ? a + (int64_t)2 * i * steps : a + i * lda + 2 * first;
      float *c = acc + i * acc_stride + j;
      switch (rows - i < MR ? rows - i : MR) {
        case 1: tessera_gemm_micro_pairs<1, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols); break;
        case 2: tessera_gemm_micro_pairs<2, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols); break;
        case 3: tessera_gemm_micro_pairs<3, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols); break;
        case 4: tessera_gemm_micro_pairs<4, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols); break;
        case 5: tessera_gemm_micro_pairs<5, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols); break;
        default: tessera_gemm_micro_pairs<6, Packed>(strip, lda, b, pairs, odd, c, acc_stride, live_cols);
      }
    }
  }
}
static_assert(TESSERA_PAIRS_MR == 6, "tessera_gemm_pairs dispatches the edge rows of a 6-row register tile");

// A transposed A, packed as pairs in strips of MR rows (a row-major A is read in place instead).
TESSERA_CPU_API int32_t tessera_cpu_pack_a_bf16x2(float *pack, uint16_t *a, int64_t offset, int64_t row_stride,
                                                          int64_t k_stride, int32_t rows, int32_t depth) {
  tessera_pack_pairs<TESSERA_PAIRS_MR>((uint32_t *)pack, (const uint16_t *)a + offset, row_stride, k_stride, rows, depth);
  return 0;
}

TESSERA_CPU_API int32_t tessera_cpu_pack_b_bf16x2(float *pack, uint16_t *b, int64_t offset, int64_t k_stride,
                                                          int64_t col_stride, int32_t cols, int32_t depth) {
  tessera_pack_pairs<TESSERA_PAIRS_NR>((uint32_t *)pack, (const uint16_t *)b + offset, col_stride, k_stride, cols, depth);
  return 0;
}

// acc += A x B, A packed by tessera_cpu_pack_a_bf16x2.
TESSERA_CPU_API int32_t tessera_cpu_gemm_bf16x2(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
                                                        int32_t rows, int32_t cols, int32_t depth) {
  tessera_gemm_pairs<true>(acc, acc_stride, (const uint16_t *)a_pack, 0, (const uint32_t *)b_pack, rows, cols, depth);
  return 0;
}

// acc += A x B, A row-major bf16 read in place: its `rows` rows from a + offset, `row_stride` apart.
// With AMX (cpu_amx.h): the whole 16-row groups over the whole 32-k steps on the tile unit, the rest of
// the rows and of the k on the micro-kernel.
TESSERA_CPU_API int32_t tessera_cpu_gemm_bf16x2_rows(float *acc, int32_t acc_stride, uint16_t *a, int64_t offset,
                                                             int64_t row_stride, float *b_pack, int32_t rows,
                                                             int32_t cols, int32_t depth) {
  const uint32_t *b = (const uint32_t *)b_pack;
  auto micro = [&](float *c, const uint16_t *rows_a, int32_t n, int32_t first) {
    tessera_gemm_pairs<false>(c, acc_stride, rows_a, row_stride, b, n, cols, depth, first);
  };
#if defined(TESSERA_AMX)
  if (tessera_amx_gemm_rows(acc, acc_stride, (const uint16_t *)a + offset, row_stride, b, rows, cols, depth, micro)) {
    return 0;
  }
#endif
  micro(acc, (const uint16_t *)a + offset, rows, 0);
  return 0;
}

#else  // no bf16 dot products: the fp32 packing and micro-kernel

TESSERA_CPU_API int32_t tessera_cpu_pack_a_bf16x2(float *pack, uint16_t *a, int64_t offset, int64_t row_stride,
                                                          int64_t k_stride, int32_t rows, int32_t depth) {
  return tessera_cpu_pack_a_bf16(pack, a, offset, row_stride, k_stride, rows, depth);
}

TESSERA_CPU_API int32_t tessera_cpu_pack_b_bf16x2(float *pack, uint16_t *b, int64_t offset, int64_t k_stride,
                                                          int64_t col_stride, int32_t cols, int32_t depth) {
  return tessera_cpu_pack_b_bf16(pack, b, offset, k_stride, col_stride, cols, depth);
}

TESSERA_CPU_API int32_t tessera_cpu_gemm_bf16x2(float *acc, int32_t acc_stride, float *a_pack, float *b_pack,
                                                        int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_f32(acc, acc_stride, a_pack, b_pack, rows, cols, depth);
}

TESSERA_CPU_API int32_t tessera_cpu_gemm_bf16x2_rows(float *acc, int32_t acc_stride, uint16_t *a, int64_t offset,
                                                             int64_t row_stride, float *b_pack, int32_t rows,
                                                             int32_t cols, int32_t depth) {
  // Packs A to fp32 (a heap panel: worker threads have small stacks) for the fp32 micro-kernel.
  const int MR = TESSERA_GEMM_MR;
  float *a_pack = (float *)malloc(sizeof(float) * (size_t)((rows + MR - 1) / MR * MR) * (size_t)depth);
  if (a_pack == nullptr) {
    return -1;
  }
  tessera_cpu_pack_a_bf16(a_pack, a, offset, row_stride, 1, rows, depth);
  tessera_cpu_gemm_f32(acc, acc_stride, a_pack, b_pack, rows, cols, depth);
  free(a_pack);
  return 0;
}

#endif
