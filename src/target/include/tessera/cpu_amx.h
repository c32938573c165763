// AMX tiles for the bf16 x bf16 CPU GEMM (cpu_gemm.h's tessera_cpu_gemm_bf16x2_rows).
//
// On a CPU with AMX-BF16 (built with -march=native there: __AMX_TILE__ and __AMX_BF16__), the
// 16-row groups of a block's rows run on the tile unit over whole steps of 32 k: per step, two A
// tiles (16 rows x 32 bf16 read in place from the row-major A, its k-pairs being 32-bit words) and
// two B tiles (16 k-pairs x 16 columns: the same pair layout the vdpbf16ps micro-kernel reads, a tile
// row being 16 words of a 64-column strip, 256 bytes apart) into a 2 x 2 grid of 16 x 16 fp32
// accumulator tiles (tdpbf16ps). The accumulators start at zero and are stored to a staging tile,
// then added into the block's accumulator under masks, so ragged columns need no other tile shape.
// The rows past the last whole 16, and the k past the last whole 32, run on the vdpbf16ps
// micro-kernel as before. Tile numbers: tmm0-3 the accumulators C[i][j] (tmm 2i + j), tmm4/5 A's
// rows 0-15 and 16-31, tmm6/7 B's columns 0-15 and 16-31.
//
// Linux hands a process the tile registers only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM); each
// library asks once, then checks the unit on a product it knows (small integers, exact in fp32)
// before it uses it for a kernel's results. tessera_cpu_amx_state() says what came of it; the
// environment's TESSERA_CPU_AMX=0 turns the unit off (the vdpbf16ps micro-kernel runs everything).
//
// TESSERA_AMX_EMULATE (a test build's define) runs the same tile program on an emulation of the
// five tile instructions it uses, written from their definitions in Intel's ISA reference, so its
// indexing, layouts and edges are tested on CPUs without AMX (tests/tile/test_gemm_amx.py).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_parallel.h"  // TESSERA_EXTERN_C

// The staging adds and the micro-kernel around the tiles are AVX-512 (every AMX CPU has it).
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#if defined(TESSERA_AMX_EMULATE)
#define TESSERA_AMX 1
#include <immintrin.h>
#elif defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
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
#define TESSERA_TILE_ZERO(t) tessera_amx_zero(t)
#define TESSERA_TILE_LOAD(t, base, stride) tessera_amx_load(t, base, stride)
#define TESSERA_TILE_STORE(t, base, stride) tessera_amx_store(t, base, stride)
#define TESSERA_TILE_DP(c, a, b) tessera_amx_dpbf16ps(c, a, b)

#else  // the tile unit

static inline void tessera_amx_load_config(const tessera_amx_config *config) { _tile_loadconfig(config); }
static inline void tessera_amx_release() { _tile_release(); }
#define TESSERA_TILE_ZERO(t) _tile_zero(t)
#define TESSERA_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TESSERA_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TESSERA_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)

#endif

// acc[0:rows, 0:cols] += A x B over the first 32 * steps k, on the tile unit. A: row-major bf16 at
// `a`, rows `lda` elements apart, `rows` a multiple of 16. B: strips of 64 columns packed as pairs
// (cpu_gemm.h), strip j / 64 at b_pack + j * b_pairs (b_pairs: the strips' k-pairs), zero past `cols`.
static inline void tessera_amx_gemm_pairs(float *acc, int64_t acc_stride, const uint16_t *a, int64_t lda,
                                          const uint32_t *b_pack, int32_t b_pairs, int32_t rows, int32_t cols,
                                          int32_t steps) {
  tessera_amx_config config = {};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {  // every tile 16 rows of 64 bytes: 16 x 16 fp32, 16 x 32 bf16, 16 pairs x 16
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  tessera_amx_load_config(&config);
  alignas(64) float stage[32][32];
  const int64_t a_bytes = lda * (int64_t)sizeof(uint16_t);
  for (int32_t j = 0; j < cols; j += 64) {
    const uint32_t *strip = b_pack + (int64_t)j * b_pairs;
    for (int32_t h = 0; h < 64 && j + h < cols; h += 32) {
      const int32_t live = cols - j - h < 32 ? cols - j - h : 32;
      for (int32_t i = 0; i < rows; i += 32) {
        const bool two = rows - i >= 32;  // a second group of 16 rows
        TESSERA_TILE_ZERO(0);
        TESSERA_TILE_ZERO(1);
        TESSERA_TILE_ZERO(2);
        TESSERA_TILE_ZERO(3);
        const uint16_t *a_rows = a + i * lda;
        for (int32_t s = 0; s < steps; ++s) {
          const uint32_t *b = strip + (int64_t)s * 16 * 64 + h;  // 16 pairs of the strip, columns h...
          TESSERA_TILE_LOAD(4, a_rows + 32 * s, a_bytes);
          TESSERA_TILE_LOAD(6, b, 64 * sizeof(uint32_t));
          TESSERA_TILE_LOAD(7, b + 16, 64 * sizeof(uint32_t));
          TESSERA_TILE_DP(0, 4, 6);
          TESSERA_TILE_DP(1, 4, 7);
          if (two) {
            TESSERA_TILE_LOAD(5, a_rows + 16 * lda + 32 * s, a_bytes);
            TESSERA_TILE_DP(2, 5, 6);
            TESSERA_TILE_DP(3, 5, 7);
          }
        }
        TESSERA_TILE_STORE(0, &stage[0][0], sizeof stage[0]);
        TESSERA_TILE_STORE(1, &stage[0][16], sizeof stage[0]);
        TESSERA_TILE_STORE(2, &stage[16][0], sizeof stage[0]);
        TESSERA_TILE_STORE(3, &stage[16][16], sizeof stage[0]);
        const __mmask16 first = (__mmask16)(live >= 16 ? 0xffffu : (1u << live) - 1u);
        const __mmask16 second = (__mmask16)(live >= 32 ? 0xffffu : live <= 16 ? 0u : (1u << (live - 16)) - 1u);
        for (int r = 0; r < (two ? 32 : 16); ++r) {
          float *dst = acc + (int64_t)(i + r) * acc_stride + j + h;
          _mm512_mask_storeu_ps(dst, first,
                                _mm512_add_ps(_mm512_maskz_loadu_ps(first, dst), _mm512_load_ps(&stage[r][0])));
          _mm512_mask_storeu_ps(dst + 16, second,
                                _mm512_add_ps(_mm512_maskz_loadu_ps(second, dst + 16), _mm512_load_ps(&stage[r][16])));
        }
      }
    }
  }
  tessera_amx_release();
}

// The tile unit on a product it knows: 32 x 48 = (32 x 64) x (64 x 48) of small integers (exact in
// fp32 whatever the order of the sums), through tessera_amx_gemm_pairs itself.
static inline bool tessera_amx_self_check() {
  enum { M = 32, N = 48, K = 64, PAIRS = K / 2 };
  static uint16_t a[M * K];
  static uint32_t b[64 * PAIRS];  // one strip of 64 columns, zero past N
  static float acc[M * N];
  auto bf16 = [](int v) { float f = (float)v; uint32_t bits; memcpy(&bits, &f, sizeof bits); return (uint16_t)(bits >> 16); };
  auto a_at = [](int i, int k) { return (i * 3 + k * 5) % 7 - 3; };
  auto b_at = [](int k, int j) { return (k * 2 + j * 7) % 5 - 2; };
  for (int i = 0; i < M; ++i) {
    for (int k = 0; k < K; ++k) {
      a[i * K + k] = bf16(a_at(i, k));
    }
  }
  memset(b, 0, sizeof b);
  for (int p = 0; p < PAIRS; ++p) {
    for (int j = 0; j < N; ++j) {
      b[p * 64 + j] = (uint32_t)bf16(b_at(2 * p, j)) | (uint32_t)bf16(b_at(2 * p + 1, j)) << 16;
    }
  }
  for (int i = 0; i < M * N; ++i) {
    acc[i] = 1.0f;
  }
  tessera_amx_gemm_pairs(acc, N, a, K, b, PAIRS, M, N, K / 32);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      int want = 1;
      for (int k = 0; k < K; ++k) {
        want += a_at(i, k) * b_at(k, j);
      }
      if (acc[i * N + j] != (float)want) {
        return false;
      }
    }
  }
  return true;
}

// 1: the tile unit runs this library's bf16 GEMMs; -1: Linux did not grant the tile registers; -2:
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
  if (!tessera_amx_self_check()) {
    fprintf(stderr, "tessera: the AMX tile unit failed its bf16 self-check; bf16 GEMMs run on AVX512-BF16\n");
    return -2;
  }
  return 1;
}

static inline int tessera_amx_state() {
  static const int state = tessera_amx_probe();  // once per library (thread-safe initialisation)
  return state;
}

#endif  // TESSERA_AMX

// What the bf16 GEMMs of this library run on: 0 built without AMX, 1 the tile unit, -1 not granted
// by Linux, -2 failed the self-check, -3 turned off (TESSERA_CPU_AMX=0).
TESSERA_EXTERN_C inline int32_t tessera_cpu_amx_state() {
#if defined(TESSERA_AMX)
  return tessera_amx_state();
#else
  return 0;
#endif
}
