// AMX tiles for the CPU's bf16 x bf16 and int8 x int8 GEMMs (tessera_cpu_gemm_bf16x2_rows in
// cpu_gemm.h, tessera_cpu_gemm_s8x4_rows in cpu_int8.h).
//
// On a CPU with AMX (built with -march=native there: __AMX_TILE__, __AMX_BF16__, __AMX_INT8__), the
// 16-row groups of a block's rows run on the tile unit over whole steps of 64 bytes of k (32 bf16 or
// 64 int8): per step, two A tiles (16 rows x 64 bytes read in place from the row-major A, its k-pairs
// or k-quads being 32-bit words) and two B tiles (16 words of k x 16 columns: the same layout the
// AVX-512 micro-kernels read, a tile row being 16 words of a 64-column strip, 256 bytes apart) into
// a 2 x 2 grid of 16 x 16 accumulator tiles (tdpbf16ps: fp32; tdpbssd: int32). The accumulators
// start at zero and are stored to a staging tile, then added into the block's accumulator under
// masks, so ragged columns need no other tile shape. The rows past the last whole 16, and the k past
// the last whole step, run on the AVX-512 micro-kernels. Tile numbers: tmm0-3 the accumulators
// C[i][j] (tmm 2i + j), tmm4/5 A's rows 0-15 and 16-31, tmm6/7 B's columns 0-15 and 16-31.
//
// Linux hands a process the tile registers only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM); each
// library asks once, then checks the unit on products it knows (small integers, exact in fp32) before
// it uses it for a kernel's results. tessera_cpu_amx_state() says what came of it; the environment's
// TESSERA_CPU_AMX=0 turns the unit off (the AVX-512 micro-kernels run everything).
//
// TESSERA_AMX_EMULATE (a test build's define) runs the same tile program on an emulation of the six
// tile instructions it uses, written from their definitions in Intel's ISA reference, so its
// indexing, layouts and edges are tested on CPUs without AMX (tests/tile/test_gemm_amx.py).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cpu_parallel.h"  // TESSERA_EXTERN_C

// The staging adds and the micro-kernel around the tiles are AVX-512 (every AMX CPU has it).
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#if defined(TESSERA_AMX_EMULATE)
#define TESSERA_AMX 1
#include <immintrin.h>
#elif defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__linux__)
#define TESSERA_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

#if defined(TESSERA_AMX)

// ldtilecfg's 64-byte operand, palette 1: each tile's rows and bytes per row.
struct alignas(64) tessera_amx_config {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(tessera_amx_config) == 64, "ldtilecfg reads 64 bytes");

#if defined(TESSERA_AMX_EMULATE)

// The tile registers of this thread (8 tiles of at most 16 rows x 64 bytes) and their shapes.
struct tessera_amx_registers {
  tessera_amx_config config;
  uint8_t tile[8][16][64];
};
static thread_local tessera_amx_registers tessera_amx_emulated;

// ldtilecfg: the shapes, every tile zeroed.
static inline void tessera_amx_load_config(const tessera_amx_config *config) {
  memset(&tessera_amx_emulated, 0, sizeof tessera_amx_emulated);
  tessera_amx_emulated.config = *config;
}
// tilerelease: back to the initial state.
static inline void tessera_amx_release() { memset(&tessera_amx_emulated, 0, sizeof tessera_amx_emulated); }
// tilezero.
static inline void tessera_amx_zero(int t) { memset(tessera_amx_emulated.tile[t], 0, sizeof tessera_amx_emulated.tile[t]); }
// tileloadd: `rows` rows of `colsb` bytes, `stride` bytes apart; the rest of the tile zeroed.
static inline void tessera_amx_load(int t, const void *base, int64_t stride) {
  const tessera_amx_config &c = tessera_amx_emulated.config;
  tessera_amx_zero(t);
  for (int r = 0; r < c.rows[t]; ++r) {
    memcpy(tessera_amx_emulated.tile[t][r], (const uint8_t *)base + r * stride, c.colsb[t]);
  }
}
// tilestored: `rows` rows of `colsb` bytes, `stride` bytes apart.
static inline void tessera_amx_store(int t, void *base, int64_t stride) {
  const tessera_amx_config &c = tessera_amx_emulated.config;
  for (int r = 0; r < c.rows[t]; ++r) {
    memcpy((uint8_t *)base + r * stride, tessera_amx_emulated.tile[t][r], c.colsb[t]);
  }
}
// A bf16 (its 16 bits) as fp32; tdpbf16ps reads bf16 denormals as zero.
static inline float tessera_amx_bf16(const uint8_t *p) {
  uint16_t half;
  memcpy(&half, p, sizeof half);
  uint32_t bits = (uint32_t)half << 16;
  if ((bits & 0x7f800000u) == 0) {
    bits &= 0x80000000u;
  }
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}
// tdpbf16ps c, a, b: c[m][n] += a[m][2k] * b[k][2n] + a[m][2k + 1] * b[k][2n + 1] over the k-pairs of
// a's rows, for c's rows and fp32 columns (b's rows are the k-pairs).
static inline void tessera_amx_dpbf16ps(int c, int a, int b) {
  const tessera_amx_config &cfg = tessera_amx_emulated.config;
  auto &t = tessera_amx_emulated.tile;
  for (int m = 0; m < cfg.rows[c]; ++m) {
    for (int n = 0; n < cfg.colsb[c] / 4; ++n) {
      float sum;
      memcpy(&sum, &t[c][m][4 * n], sizeof sum);
      for (int k = 0; k < cfg.colsb[a] / 4; ++k) {
        sum += tessera_amx_bf16(&t[a][m][4 * k]) * tessera_amx_bf16(&t[b][k][4 * n]);
        sum += tessera_amx_bf16(&t[a][m][4 * k + 2]) * tessera_amx_bf16(&t[b][k][4 * n + 2]);
      }
      memcpy(&t[c][m][4 * n], &sum, sizeof sum);
    }
  }
}
// tdpbssd c, a, b: c[m][n] += the sum over t < 4 of a[m][4k + t] * b[k][4n + t] (signed bytes, int32
// sums that wrap) over the k-quads of a's rows, for c's rows and int32 columns.
static inline void tessera_amx_dpbssd(int c, int a, int b) {
  const tessera_amx_config &cfg = tessera_amx_emulated.config;
  auto &t = tessera_amx_emulated.tile;
  for (int m = 0; m < cfg.rows[c]; ++m) {
    for (int n = 0; n < cfg.colsb[c] / 4; ++n) {
      uint32_t sum;
      memcpy(&sum, &t[c][m][4 * n], sizeof sum);
      for (int k = 0; k < cfg.colsb[a] / 4; ++k) {
        for (int q = 0; q < 4; ++q) {
          sum += (uint32_t)((int32_t)(int8_t)t[a][m][4 * k + q] * (int32_t)(int8_t)t[b][k][4 * n + q]);
        }
      }
      memcpy(&t[c][m][4 * n], &sum, sizeof sum);
    }
  }
}
#define TESSERA_TILE_ZERO(t) tessera_amx_zero(t)
#define TESSERA_TILE_LOAD(t, base, stride) tessera_amx_load(t, base, stride)
#define TESSERA_TILE_STORE(t, base, stride) tessera_amx_store(t, base, stride)
#define TESSERA_TILE_DP(c, a, b) tessera_amx_dpbf16ps(c, a, b)
#define TESSERA_TILE_DP_S8(c, a, b) tessera_amx_dpbssd(c, a, b)

#else  // the tile unit

static inline void tessera_amx_load_config(const tessera_amx_config *config) { _tile_loadconfig(config); }
static inline void tessera_amx_release() { _tile_release(); }
#define TESSERA_TILE_ZERO(t) _tile_zero(t)
#define TESSERA_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TESSERA_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TESSERA_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TESSERA_TILE_DP_S8(c, a, b) _tile_dpbssd(c, a, b)

#endif

// tmm c += tmm a x tmm b: tdpbssd (int8) or tdpbf16ps (bf16). A macro: GCC's tile intrinsics spell
// their tile numbers into the instruction's text, so they must be literals, not template arguments.
#define TESSERA_TILE_DOT(int8, c, a, b) \
  do {                                  \
    if (int8) {                         \
      TESSERA_TILE_DP_S8(c, a, b);      \
    } else {                            \
      TESSERA_TILE_DP(c, a, b);         \
    }                                   \
  } while (0)

// acc[0:rows, 0:cols] += A x B over the first 64 bytes' worth of k times `steps`, on the tile unit:
// bf16 (Int8 false: 32 k a step, fp32 acc, tdpbf16ps) or int8 (64 k a step, int32 acc, tdpbssd). A:
// row-major at `a`, rows `lda` elements apart, `rows` a multiple of 16. B: strips of 64 columns packed
// as 32-bit words of 2 (bf16) or 4 (int8) consecutive k (cpu_gemm.h, cpu_int8.h), strip j / 64 at
// b_pack + j * b_words (b_words: the words of a strip's column), zero past `cols`.
template <bool Int8>
static inline void tessera_amx_gemm(void *acc_base, int64_t acc_stride, const void *a_base, int64_t lda,
                                    const uint32_t *b_pack, int32_t b_words, int32_t rows, int32_t cols,
                                    int32_t steps) {
  using Acc = typename std::conditional<Int8, int32_t, float>::type;
  using Elem = typename std::conditional<Int8, int8_t, uint16_t>::type;
  const int K_STEP = 64 / (int)sizeof(Elem);  // a tile row of A: 64 bytes
  Acc *acc = (Acc *)acc_base;
  const Elem *a = (const Elem *)a_base;
  tessera_amx_config config = {};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {  // every tile 16 rows of 64 bytes: 16 x 16 accumulators, A's 16 rows, 16 words of B
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  tessera_amx_load_config(&config);
  alignas(64) Acc stage[32][32];
  const int64_t a_bytes = lda * (int64_t)sizeof(Elem);
  for (int32_t j = 0; j < cols; j += 64) {
    const uint32_t *strip = b_pack + (int64_t)j * b_words;
    for (int32_t h = 0; h < 64 && j + h < cols; h += 32) {
      const int32_t live = cols - j - h < 32 ? cols - j - h : 32;
      for (int32_t i = 0; i < rows; i += 32) {
        const bool two = rows - i >= 32;  // a second group of 16 rows
        TESSERA_TILE_ZERO(0);
        TESSERA_TILE_ZERO(1);
        TESSERA_TILE_ZERO(2);
        TESSERA_TILE_ZERO(3);
        const Elem *a_rows = a + i * lda;
        for (int32_t s = 0; s < steps; ++s) {
          const uint32_t *b = strip + (int64_t)s * 16 * 64 + h;  // 16 words of k of the strip, columns h...
          TESSERA_TILE_LOAD(4, a_rows + K_STEP * s, a_bytes);
          TESSERA_TILE_LOAD(6, b, 64 * sizeof(uint32_t));
          TESSERA_TILE_LOAD(7, b + 16, 64 * sizeof(uint32_t));
          TESSERA_TILE_DOT(Int8, 0, 4, 6);
          TESSERA_TILE_DOT(Int8, 1, 4, 7);
          if (two) {
            TESSERA_TILE_LOAD(5, a_rows + 16 * lda + K_STEP * s, a_bytes);
            TESSERA_TILE_DOT(Int8, 2, 5, 6);
            TESSERA_TILE_DOT(Int8, 3, 5, 7);
          }
        }
        TESSERA_TILE_STORE(0, &stage[0][0], sizeof stage[0]);
        TESSERA_TILE_STORE(1, &stage[0][16], sizeof stage[0]);
        TESSERA_TILE_STORE(2, &stage[16][0], sizeof stage[0]);
        TESSERA_TILE_STORE(3, &stage[16][16], sizeof stage[0]);
        const __mmask16 first = (__mmask16)(live >= 16 ? 0xffffu : (1u << live) - 1u);
        const __mmask16 second = (__mmask16)(live >= 32 ? 0xffffu : live <= 16 ? 0u : (1u << (live - 16)) - 1u);
        for (int r = 0; r < (two ? 32 : 16); ++r) {
          Acc *dst = acc + (int64_t)(i + r) * acc_stride + j + h;
          for (int half = 0; half < 2; ++half) {
            const __mmask16 mask = half ? second : first;
            if (Int8) {
              const __m512i sum = _mm512_add_epi32(_mm512_maskz_loadu_epi32(mask, dst + 16 * half),
                                                   _mm512_load_si512((const void *)&stage[r][16 * half]));
              _mm512_mask_storeu_epi32(dst + 16 * half, mask, sum);
            } else {
              const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst + 16 * half),
                                               _mm512_load_ps((const float *)&stage[r][16 * half]));
              _mm512_mask_storeu_ps(dst + 16 * half, mask, sum);
            }
          }
        }
      }
    }
  }
  tessera_amx_release();
}

// The tile unit on a product it knows: 32 x 48 = (32 x K) x (K x 48) of small integers (exact in fp32
// whatever the order of the sums) through tessera_amx_gemm itself, for bf16 (K = 64) and int8 (K = 128).
template <bool Int8>
static inline bool tessera_amx_self_check() {
  enum { M = 32, N = 48, K = Int8 ? 128 : 64, PER_WORD = Int8 ? 4 : 2, WORDS = K / PER_WORD };
  using Elem = typename std::conditional<Int8, int8_t, uint16_t>::type;
  using Acc = typename std::conditional<Int8, int32_t, float>::type;
  static Elem a[M * K];
  static uint32_t b[64 * WORDS];  // one strip of 64 columns, zero past N
  static Acc acc[M * N];
  auto element = [](int v) -> uint32_t {  // bf16 bits, or the int8 byte
    if (Int8) {
      return (uint32_t)(uint8_t)(int8_t)v;
    }
    const float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits >> 16;
  };
  auto a_at = [](int i, int k) { return (i * 3 + k * 5) % 7 - 3; };
  auto b_at = [](int k, int j) { return (k * 2 + j * 7) % 5 - 2; };
  for (int i = 0; i < M; ++i) {
    for (int k = 0; k < K; ++k) {
      a[i * K + k] = (Elem)element(a_at(i, k));
    }
  }
  memset(b, 0, sizeof b);
  for (int w = 0; w < WORDS; ++w) {
    for (int j = 0; j < N; ++j) {
      for (int t = 0; t < PER_WORD; ++t) {
        b[w * 64 + j] |= element(b_at(PER_WORD * w + t, j)) << (32 / PER_WORD * t);
      }
    }
  }
  for (int i = 0; i < M * N; ++i) {
    acc[i] = 1;
  }
  tessera_amx_gemm<Int8>(acc, N, a, K, b, WORDS, M, N, 2);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      int want = 1;
      for (int k = 0; k < K; ++k) {
        want += a_at(i, k) * b_at(k, j);
      }
      if (acc[i * N + j] != (Acc)want) {
        return false;
      }
    }
  }
  return true;
}

// 1: the tile unit runs this library's bf16 and int8 GEMMs; -1: Linux did not grant the tile registers; -2:
// the unit failed the self-check; -3: TESSERA_CPU_AMX=0 in the environment.
static inline int tessera_amx_probe() {
  const char *setting = getenv("TESSERA_CPU_AMX");
  if (setting != nullptr && strcmp(setting, "0") == 0) {
    return -3;
  }
#if !defined(TESSERA_AMX_EMULATE)
  const long request_permission = 0x1023, xtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  if (syscall(SYS_arch_prctl, request_permission, xtiledata) != 0) {
    return -1;
  }
#endif
  if (!tessera_amx_self_check<false>() || !tessera_amx_self_check<true>()) {
    fprintf(stderr, "tessera: the AMX tile unit failed its self-check; bf16 and int8 GEMMs run on AVX-512\n");
    return -2;
  }
  return 1;
}

static inline int tessera_amx_state() {
  static const int state = tessera_amx_probe();  // once per library (thread-safe initialisation)
  return state;
}

// acc[0:rows, 0:cols] += A x B over `depth` with the tile unit where this library uses it: the whole
// 16-row groups over the whole steps of 64 bytes of k on the tiles (A: bf16 or int8 rows read in place,
// B: its strips of 32-bit k-words), then `rest(acc, a, rows, first)` (the caller's micro-kernel: `rows`
// rows of A from `a` into `acc`, from k-word `first` on, over all columns) for the k past the last step
// and for the rows past the last group. False, with nothing done, where the unit is not in use or no
// group or step is whole (the caller's micro-kernel then runs everything).
template <typename Acc, typename Elem, typename Rest>
static inline bool tessera_amx_gemm_rows(Acc *acc, int64_t acc_stride, const Elem *a, int64_t lda, const uint32_t *b,
                                         int32_t rows, int32_t cols, int32_t depth, Rest rest) {
  constexpr bool Int8 = sizeof(Elem) == 1;
  const int32_t k_step = 64 / (int32_t)sizeof(Elem), per_word = 4 / (int32_t)sizeof(Elem);
  const int32_t tile_rows = rows / 16 * 16, steps = depth / k_step;
  if (tile_rows == 0 || steps == 0 || tessera_amx_state() != 1) {
    return false;
  }
  tessera_amx_gemm<Int8>(acc, acc_stride, a, lda, b, (depth + per_word - 1) / per_word, tile_rows, cols, steps);
  if (depth > k_step * steps) {
    rest(acc, a, tile_rows, 16 * steps);  // a step is 16 words of k
  }
  if (rows > tile_rows) {
    rest(acc + (int64_t)tile_rows * acc_stride, a + tile_rows * lda, rows - tile_rows, 0);
  }
  return true;
}

#endif  // TESSERA_AMX

// What the bf16 and int8 GEMMs of this library run on: 0 built without AMX, 1 the tile unit, -1 not granted
// by Linux, -2 failed the self-check, -3 turned off (TESSERA_CPU_AMX=0).
TESSERA_CPU_API int32_t tessera_cpu_amx_state() {
#if defined(TESSERA_AMX)
  return tessera_amx_state();
#else
  return 0;
#endif
}
