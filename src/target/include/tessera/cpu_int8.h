// int8 x int8 -> int32 GEMMs of the CPU GEMM tile program (tessera_tvm/tile/gemm.py), on k-quads.
//
// As the bf16 GEMM's k-pairs (cpu_gemm.h), with four consecutive k in a 32-bit word: B is packed in
// strips of 64 columns, word (q, c) of a strip at q * 64 + c holding B[4q + t, c] in byte t (zero past
// the strip's columns and past `depth`), and a row-major A is read in place, a quad of its row being
// one word. Per k-quad the micro-kernel broadcasts a word of each of 6 rows of A (from memory) against
// 4 vectors of B (6 x 4 int32 accumulators). AVX512-VNNI's vpdpbusd multiplies unsigned by signed
// bytes, so B's bytes are offset by 128 (a xor of their sign bits, when packed; where AMX reads the
// same panels signed, at each load) and 128 x each row's sum of A over the same k is subtracted:
// sum(a * (b + 128)) - 128 * sum(a) = sum(a * b), exact in int32 (sums wrap, as numpy's and torch's
// int32 products do). Where the CPU has AMX, whole 16-row groups over whole
// 64-k steps run on tdpbssd tiles (cpu_amx.h), signed by signed. Without VNNI, plain loops over the
// same panels.
//
// An A that is not row-major (transposed) is first copied into a row-major block.
//
//   tessera_cpu_pack_b_s8x4(panel, B, offset of B[k0, col0], k_stride, col_stride, cols, depth)
//   tessera_cpu_gemm_s8x4_rows(acc, acc_stride, A, offset of A[row0, k0], row_stride, panel, rows, cols, depth)
//   tessera_cpu_pack_a_s8x4(block, A, offset of A[row0, k0], row_stride, k_stride, rows, depth)
//   tessera_cpu_gemm_s8x4(acc, acc_stride, block, panel, rows, cols, depth)
#pragma once

#include <stdint.h>
#include <string.h>

#include "cpu_amx.h"
#include "cpu_parallel.h"  // TESSERA_EXTERN_C

#define TESSERA_QUADS_MR 6  // 6 x 4 accumulators + 4 B vectors + 1 broadcast (+ 4 column sums) of 32 zmm
#define TESSERA_QUADS_NV 4
#define TESSERA_QUADS_NR 64  // columns of a B strip (the vdpbf16ps micro-kernel's too: the AMX code reads both)

// B's bytes as packed: offset by 128 (vpdpbusd's unsigned operand) where only the VNNI micro-kernel
// reads them; signed where AMX's tdpbssd reads them too (the micro-kernel then offsets each load) and
// for the plain loops.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__) && !defined(TESSERA_AMX)
#define TESSERA_QUADS_B_OFFSET 0x80808080u
#else
#define TESSERA_QUADS_B_OFFSET 0u
#endif

// The word of k-quad `q` of `n` bytes from `p`, `stride` apart: byte t = p[(4q + t) * stride] for
// 4q + t < depth, zero past it.
static inline uint32_t tessera_s8_quad(const int8_t *p, int64_t stride, int32_t q, int32_t depth) {
  uint32_t word = 0;
  for (int32_t t = 0; t < 4 && 4 * q + t < depth; ++t) {
    word |= (uint32_t)(uint8_t)p[(int64_t)(4 * q + t) * stride] << (8 * t);
  }
  return word;
}

// pack[strip][q][c] = the k-quad q of column c (bytes t = B[4q + t, c]), zero past `cols` and `depth`,
// each byte offset by 128 where TESSERA_QUADS_B_OFFSET says so.
TESSERA_CPU_API int32_t tessera_cpu_pack_b_s8x4(float *pack, int8_t *b, int64_t offset, int64_t k_stride,
                                                        int64_t col_stride, int32_t cols, int32_t depth) {
  const int NR = TESSERA_QUADS_NR;
  const int32_t quads = (depth + 3) / 4;
  const int8_t *src = b + offset;
  for (int32_t j0 = 0; j0 < cols; j0 += NR) {
    uint32_t *strip = (uint32_t *)pack + (int64_t)j0 * quads;
    const int32_t live = cols - j0 < NR ? cols - j0 : NR;
    for (int32_t q = 0; q < quads; ++q) {
      uint32_t *__restrict dst = strip + (int64_t)q * NR;
      const int8_t *column = src + (int64_t)j0 * col_stride;
      int32_t c = 0;
      if (4 * q + 4 <= depth && col_stride == 1) {  // a row-major B: 4 rows of bytes, interleaved
        const uint8_t *r0 = (const uint8_t *)column + (int64_t)4 * q * k_stride;
        const uint8_t *r1 = r0 + k_stride, *r2 = r1 + k_stride, *r3 = r2 + k_stride;
        for (; c < live; ++c) {
          dst[c] = ((uint32_t)r0[c] | (uint32_t)r1[c] << 8 | (uint32_t)r2[c] << 16 | (uint32_t)r3[c] << 24) ^
                   TESSERA_QUADS_B_OFFSET;
        }
      } else if (4 * q + 4 <= depth && k_stride == 1) {  // a transposed B: a quad is one word of its row
        for (; c < live; ++c) {
          uint32_t word;
          memcpy(&word, column + c * col_stride + 4 * q, sizeof word);
          dst[c] = word ^ TESSERA_QUADS_B_OFFSET;
        }
      } else {
        for (; c < live; ++c) {
          dst[c] = tessera_s8_quad(column + c * col_stride, k_stride, q, depth) ^ TESSERA_QUADS_B_OFFSET;
        }
      }
      for (; c < NR; ++c) {
        dst[c] = TESSERA_QUADS_B_OFFSET;
      }
    }
  }
  return 0;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)

// The sum of the `n` int8 at `row`, in int32.
static inline int32_t tessera_s8_sum(const int8_t *row, int32_t n) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
  int32_t k = 0;
  for (; k + 64 <= n; k += 64) {
    sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512((const void *)(row + k)));
  }
  if (k < n) {
    const __mmask64 live = n - k >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - k)) - 1;
    sum = _mm512_dpbusd_epi32(sum, ones, _mm512_maskz_loadu_epi8(live, row + k));
  }
  return _mm512_reduce_add_epi32(sum);
}

// c[0:R, 0:cols] += A x B over `quads` k-quads, then `tail` (1-3) last k alone. A: R rows of int8 at
// `a`, `lda` apart, broadcast a word at a time; B: a strip of 64 columns packed as quads, its bytes
// offset by 128 (vpdpbusd's unsigned operand: a xor of the sign bits, at packing or here); `offset[r]`:
// 128 x the sum of row r's int8 over the same k, subtracted.
template <int R>
static inline void tessera_gemm_micro_quads(const int8_t *__restrict a, int64_t lda, const uint32_t *__restrict b,
                                            int32_t quads, int32_t tail, const int32_t *offset, int32_t *__restrict c,
                                            int64_t ldc, int32_t cols) {
  const int NV = TESSERA_QUADS_NV, NR = TESSERA_QUADS_NR, VEC = 16;
  const __m512i sign = _mm512_set1_epi32((int)(0x80808080u ^ TESSERA_QUADS_B_OFFSET));  // what B still needs
  // int32 lanes (GCC 12 keeps an array of __m512i, which vpdpbusd reads as int32 lanes, in memory:
  // every accumulator stored each k-quad, 2.3x slower).
  __v16si sum[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      sum[r][v] = (__v16si)_mm512_setzero_si512();
    }
  }
  auto step = [&](int32_t q, auto word) __attribute__((always_inline)) {
    __v16si bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512i packed = _mm512_loadu_si512((const void *)(b + (int64_t)q * NR + v * VEC));
      bv[v] = (__v16si)(TESSERA_QUADS_B_OFFSET ? packed : _mm512_xor_si512(packed, sign));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __v16si x = (__v16si)_mm512_set1_epi32((int)word(r));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        sum[r][v] = (__v16si)_mm512_dpbusd_epi32((__m512i)sum[r][v], (__m512i)bv[v], (__m512i)x);
      }
    }
  };
  for (int32_t q = 0; q < quads; ++q) {
    step(q, [&](int r) __attribute__((always_inline)) {
      uint32_t word;
      memcpy(&word, a + r * lda + 4 * q, sizeof word);
      return word;
    });
  }
  if (tail) {  // the last k: the row may end there (its missing bytes read as 0, against B's 0 + 128)
    step(quads, [&](int r) __attribute__((always_inline)) { return tessera_s8_quad(a + r * lda, 1, quads, 4 * quads + tail); });
  }
  __mmask16 live[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int32_t lanes = cols - v * VEC;
    live[v] = (__mmask16)(lanes >= VEC ? 0xffffu : lanes <= 0 ? 0u : (1u << lanes) - 1u);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512i row_offset = _mm512_set1_epi32(offset[r]);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      int32_t *dst = c + r * ldc + v * VEC;
      const __m512i add = _mm512_sub_epi32((__m512i)sum[r][v], row_offset);
      _mm512_mask_storeu_epi32(dst, live[v], _mm512_add_epi32(_mm512_maskz_loadu_epi32(live[v], dst), add));
    }
  }
}

// acc[0:rows, 0:cols] += A x B over `depth` from k-quad `first` on: per register tile of rows, their
// sums over those k, then the micro-kernel over every strip.
static inline void tessera_gemm_quads(int32_t *acc, int64_t acc_stride, const int8_t *a, int64_t lda,
                                      const uint32_t *b_pack, int32_t rows, int32_t cols, int32_t depth,
                                      int32_t first = 0) {
  const int MR = TESSERA_QUADS_MR, NR = TESSERA_QUADS_NR;
  const int32_t words = (depth + 3) / 4;  // quads of a strip's column
  const int32_t quads = depth / 4 - first, tail = depth % 4;
  for (int32_t i = 0; i < rows; i += MR) {
    const int32_t live_rows = rows - i < MR ? rows - i : MR;
    const int8_t *rows_a = a + i * lda + 4 * first;
    int32_t offset[MR];
    for (int32_t r = 0; r < live_rows; ++r) {
      offset[r] = (int32_t)((uint32_t)tessera_s8_sum(rows_a + r * lda, depth - 4 * first) << 7);
    }
    for (int32_t j = 0; j < cols; j += NR) {
      const int32_t live_cols = cols - j < NR ? cols - j : NR;
      const uint32_t *b = b_pack + (int64_t)j * words + (int64_t)first * NR;
      int32_t *c = acc + i * acc_stride + j;
      switch (live_rows) {
        case 1: tessera_gemm_micro_quads<1>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols); break;
        case 2: tessera_gemm_micro_quads<2>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols); break;
        case 3: tessera_gemm_micro_quads<3>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols); break;
        case 4: tessera_gemm_micro_quads<4>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols); break;
        case 5: tessera_gemm_micro_quads<5>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols); break;
        default: tessera_gemm_micro_quads<6>(rows_a, lda, b, quads, tail, offset, c, acc_stride, live_cols);
      }
    }
  }
}
static_assert(TESSERA_QUADS_MR == 6, "tessera_gemm_quads dispatches the edge rows of a 6-row register tile");

#else  // no VNNI: plain loops over the same panels

static inline void tessera_gemm_quads(int32_t *acc, int64_t acc_stride, const int8_t *a, int64_t lda,
                                      const uint32_t *b_pack, int32_t rows, int32_t cols, int32_t depth,
                                      int32_t first = 0) {
  const int NR = TESSERA_QUADS_NR;
  const int32_t words = (depth + 3) / 4;
  for (int32_t j = 0; j < cols; j += NR) {
    const int32_t live = cols - j < NR ? cols - j : NR;
    const uint32_t *strip = b_pack + (int64_t)j * words;
    for (int32_t i = 0; i < rows; ++i) {
      int32_t *c = acc + i * acc_stride + j;
      for (int32_t k = 4 * first; k < depth; ++k) {
        const uint32_t a_k = (uint32_t)(int32_t)a[i * lda + k];
        const uint32_t *word = strip + (int64_t)(k / 4) * NR;
        for (int32_t n = 0; n < live; ++n) {  // int32 sums that wrap: unsigned arithmetic
          c[n] = (int32_t)((uint32_t)c[n] + a_k * (uint32_t)(int32_t)(int8_t)(word[n] >> (8 * (k % 4))));
        }
      }
    }
  }
}

#endif

// acc += A x B, A row-major int8 read in place: its `rows` rows from a + offset, `row_stride` apart;
// B packed by tessera_cpu_pack_b_s8x4. With AMX (cpu_amx.h): the whole 16-row groups over the whole
// 64-k steps on the tile unit, the rest on the micro-kernel.
TESSERA_CPU_API int32_t tessera_cpu_gemm_s8x4_rows(int32_t *acc, int32_t acc_stride, int8_t *a, int64_t offset,
                                                           int64_t row_stride, float *b_pack, int32_t rows, int32_t cols,
                                                           int32_t depth) {
  const uint32_t *b = (const uint32_t *)b_pack;
  auto micro = [&](int32_t *c, const int8_t *rows_a, int32_t n, int32_t first) {
    tessera_gemm_quads(c, acc_stride, rows_a, row_stride, b, n, cols, depth, first);
  };
#if defined(TESSERA_AMX)
  if (tessera_amx_gemm_rows(acc, acc_stride, (const int8_t *)a + offset, row_stride, b, rows, cols, depth, micro)) {
    return 0;
  }
#endif
  micro(acc, (const int8_t *)a + offset, rows, 0);
  return 0;
}

// block[r * depth + k] = A[row0 + r, k0 + k]: `rows` x `depth` bytes of an A read through its strides
// (a transposed A: rows 1 apart, k `M` apart), row-major for tessera_cpu_gemm_s8x4. The fp32 block
// the tile program allocates holds at least as many bytes (rows x quads words).
TESSERA_CPU_API int32_t tessera_cpu_pack_a_s8x4(float *block, int8_t *a, int64_t offset, int64_t row_stride,
                                                        int64_t k_stride, int32_t rows, int32_t depth) {
  int8_t *__restrict dst = (int8_t *)block;
  const int8_t *src = a + offset;
  int32_t k = 0;
  if (row_stride == 1) {  // a transposed A: four of its rows (k .. k + 3) give each row's quad word,
    const int32_t whole = depth / 4 * 4;  // 32 rows at a time, whose block rows stay in L1 meanwhile
    for (int32_t r0 = 0; r0 < rows; r0 += 32) {
      const int32_t r1 = rows - r0 < 32 ? rows : r0 + 32;
      for (int32_t kq = 0; kq < whole; kq += 4) {
        const uint8_t *s0 = (const uint8_t *)src + (int64_t)kq * k_stride, *s1 = s0 + k_stride;
        const uint8_t *s2 = s1 + k_stride, *s3 = s2 + k_stride;
        for (int32_t r = r0; r < r1; ++r) {
          const uint32_t word = s0[r] | (uint32_t)s1[r] << 8 | (uint32_t)s2[r] << 16 | (uint32_t)s3[r] << 24;
          memcpy(dst + (int64_t)r * depth + kq, &word, 4);
        }
      }
    }
    k = whole;
  }
  for (; k < depth; ++k) {
    const int8_t *column = src + (int64_t)k * k_stride;
    for (int32_t r = 0; r < rows; ++r) {
      dst[(int64_t)r * depth + k] = column[(int64_t)r * row_stride];
    }
  }
  return 0;
}

// acc += A x B, A the row-major block tessera_cpu_pack_a_s8x4 wrote (rows `depth` bytes apart).
TESSERA_CPU_API int32_t tessera_cpu_gemm_s8x4(int32_t *acc, int32_t acc_stride, float *block, float *b_pack,
                                                      int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_s8x4_rows(acc, acc_stride, (int8_t *)block, 0, depth, b_pack, rows, cols, depth);
}
