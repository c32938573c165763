// Winograd convolution of Tessera's CPU tile program (tessera_tvm/tile/conv.py: the winograd program):
// a 3 x 3, stride-1, undilated convolution as F(M x M, 3 x 3) with M = 4 and A = M + 2 = 6.
//
// Each M x M tile of the output is Y = AT [ sum_c (G g_oc GT) . (BT d_c B) ] A, where d_c is the
// A x A input window of the tile in channel c, g_oc the 3 x 3 filter, and . the element-wise product:
// per tile, A * A = 36 products per (o, c) where the direct convolution takes 9 * M * M = 144. Over a
// block of tiles the A * A element-wise products are A * A GEMMs over the channels, M_xi[t, o] =
// sum_c V_xi[t, c] U_xi[c, o] (xi = one of the A * A positions), on the packed micro-kernel of
// cpu_gemm.h:
//
//   U (weights)  tessera_cpu_winograd_weights_m4_<dtype>: G g GT of each filter of the block's output
//                channels, written as the B strips of NR output channels the micro-kernel reads
//                (element (c, o) of U_xi at xi * u_xi + (o / NR) * C * NR + c * NR + o % NR).
//   V (input)    per chunk of whole tile rows, BT d B of every tile and channel, written as the A strips
//                of MR tiles (element (t, c) of V_xi at xi * v_xi + (t / MR) * C * MR + c * MR + t % MR),
//                computed for the MR tiles of a strip at once in vector lanes (a strip's tiles may span
//                several tile rows: each lane is loaded from its tile's row).
//   M            the A * A GEMMs, M_xi[t, o] at xi * m_xi + t * ldm + o.
//   Y            AT M A of each tile for VEC output channels at once in vector lanes; the VEC / M tiles
//                of a row that make VEC output columns are transposed in registers, so that each
//                channel's output row lands in `acc` as the direct program's does (channel-major, rows
//                `row_stride` apart), for the tile program's epilogue.
//
// The input is copied per channel and chunk into `xph`: the zero-padded rows the chunk reads, each
// split into M phases of TWs floats (phase p holds padded columns p, p + M, ...), so that the
// element (j, k) of the windows of consecutive tiles of a row are consecutive floats.
//
// Why F(4x4): F(2x2, 3x3) (16 products against 36, 2.25x fewer) measured 1.5x the direct program's
// speed at 56x56 C=64 where F(4x4) measured 2.5x. Its price is accuracy: against a float64 reference
// (64 channels of unit normal inputs, He-scaled weights, outputs of rms 1.4) F(4x4) errs by 2e-5 at
// most, F(2x2) by 1.4e-6 and the direct convolution by 1.3e-6.
#pragma once

#include "cpu_gemm.h"

template <int M>
struct tessera_winograd_matrices;

// F(4x4, 3x3) (interpolation points 0, 1, -1, 2, -2).
template <>
struct tessera_winograd_matrices<4> {
  static constexpr float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                     {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr float G[6][3] = {{1.0f / 4, 0, 0},
                                    {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                    {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                    {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                    {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                    {0, 0, 1}};
  static constexpr float AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

// out[i * out_step] = sum_j mat[i][j] * in[j * in_step] for vectors. The loops unroll and the matrix
// is a constant, so its zeros drop out and its ones are plain adds (no multiply by 0 or 1 is left).
template <int ROWS, int COLS>
__attribute__((always_inline)) static inline void tessera_winograd_apply(const float (&mat)[ROWS][COLS],
                                                                         const tessera_vf *in, int in_step,
                                                                         tessera_vf *out, int out_step) {
#pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i) {
    tessera_vf sum = (tessera_vf){};
    bool first = true;
#pragma GCC unroll 8
    for (int j = 0; j < COLS; ++j) {
      const float c = mat[i][j];
      if (c == 0.0f) continue;
      const tessera_vf x = in[j * in_step];
      if (first) {
        sum = c == 1.0f ? x : c == -1.0f ? -x : c * x;
        first = false;
      } else if (c == 1.0f) {
        sum += x;
      } else if (c == -1.0f) {
        sum -= x;
      } else {
        sum += c * x;
      }
    }
    out[i * out_step] = sum;
  }
}

// ------------------------------------------------------------------------------------ vector lanes

// Lanes [first, first + count) of `v` loaded from p[0 .. count) (the other lanes kept).
static inline tessera_vf tessera_winograd_load_lanes(tessera_vf v, const float *p, int32_t first, int32_t count) {
#if defined(__AVX512F__)
  const __mmask16 lanes = (__mmask16)(((1u << count) - 1u) << first);
  return (tessera_vf)_mm512_mask_loadu_ps((__m512)v, lanes, p - first);
#else
  for (int32_t l = 0; l < count; ++l) v[first + l] = p[l];
  return v;
#endif
}

// The first `count` lanes of `v` stored to p[0 .. count).
static inline void tessera_winograd_store_lanes(float *p, tessera_vf v, int32_t count) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << count) - 1u), (__m512)v);
#else
  if (count == TESSERA_GEMM_VEC) {
    *(tessera_vf_unaligned *)p = v;
    return;
  }
  for (int32_t l = 0; l < count; ++l) p[l] = v[l];
#endif
}

// rows[i] = lane i of every vector of m: a VEC x VEC transpose.
static inline void tessera_winograd_transpose(tessera_vf m[TESSERA_GEMM_VEC]) {
#if defined(__AVX512F__)
  tessera_transpose_16x16((__m512i *)m);
#else
  const int VEC = TESSERA_GEMM_VEC;
  float t[VEC][VEC];
  for (int i = 0; i < VEC; ++i)
    for (int j = 0; j < VEC; ++j) t[j][i] = m[i][j];
  for (int i = 0; i < VEC; ++i) memcpy(&m[i], t[i], sizeof(float) * VEC);
#endif
}

// ------------------------------------------------------------------------------------ weights

// The floats between two positions xi of U, V or M: `floats` and a cache line, so that the A * A
// positions of one element do not all map to one L1 set (a power of two apart, they did: writing U
// of 64 x 64 channels took 4x as long).
static inline int64_t tessera_winograd_stride(int64_t floats) { return (floats + 15) / 16 * 16 + 16; }

// The floats of one position of U: the B strips of `channels` output channels over C channels.
static inline int64_t tessera_winograd_u_stride(int32_t C, int32_t channels) {
  return tessera_winograd_stride((int64_t)(channels + TESSERA_GEMM_NR - 1) / TESSERA_GEMM_NR * TESSERA_GEMM_NR * C);
}

// g[tap][l] = the 3 x 3 filter of output channel l (`stride` floats apart from l - 1) at w, for the
// `live` first lanes (the others zero). (A gather instruction per tap ran no faster: writing U is what
// costs, 4x the weights' floats, to L3 once they pass L2.)
template <typename T>
static inline void tessera_winograd_filters(tessera_vf g[9], const T *__restrict w, int64_t stride, int32_t live) {
#pragma GCC unroll 9
  for (int tap = 0; tap < 9; ++tap) g[tap] = (tessera_vf){};
  for (int32_t l = 0; l < live; ++l) {
#pragma GCC unroll 9
    for (int tap = 0; tap < 9; ++tap) g[tap][l] = tessera_to_float(w[l * stride + tap]);
  }
}

// U for the block's `channels` output channels (w: the first one's filters, `C` channels of 3 x 3
// each) at u, as B strips of NR columns, tessera_winograd_u_stride floats per position xi;
// the padding columns of the last strip are zero. VEC output channels at a time in vector lanes.
template <int M, typename T>
static inline void tessera_winograd_weights(float *__restrict u, const T *__restrict w, int32_t C, int32_t channels) {
  using Mat = tessera_winograd_matrices<M>;
  const int A = M + 2, VEC = TESSERA_GEMM_VEC, NR = TESSERA_GEMM_NR;
  const int64_t u_xi = tessera_winograd_u_stride(C, channels), filter = (int64_t)C * 9;
  for (int32_t o0 = 0; o0 < (channels + NR - 1) / NR * NR; o0 += VEC) {
    const int32_t live = channels - o0 < VEC ? (channels - o0 > 0 ? channels - o0 : 0) : VEC;
    float *strip = u + (int64_t)(o0 / NR) * C * NR + o0 % NR;
    for (int32_t c = 0; c < C; ++c) {
      tessera_vf g[9], gt[A * 3], out[A * A];
      tessera_winograd_filters(g, w + o0 * filter + c * 9, filter, live);
      // gt[i][s] = sum_r G[i][r] g[r][s]; out[i][k] = sum_s G[k][s] gt[i][s]
#pragma GCC unroll 3
      for (int s = 0; s < 3; ++s) tessera_winograd_apply(Mat::G, g + s, 3, gt + s, 3);
#pragma GCC unroll 6
      for (int i = 0; i < A; ++i) tessera_winograd_apply(Mat::G, gt + i * 3, 1, out + i * A, 1);
#pragma GCC unroll 36
      for (int xi = 0; xi < A * A; ++xi) *(tessera_vf_unaligned *)(strip + xi * u_xi + c * NR) = out[xi];
    }
  }
}

// ------------------------------------------------------------------------------------ a chunk

// phases[p * count + j] = column j * M + p of an input row `src` of W columns zero-padded by `left`
// columns on the left (and as many as it takes on the right): the row split into M phases.
template <int M, typename T>
static inline void tessera_winograd_phases(float *__restrict phases, const T *__restrict src, int32_t W, int32_t left,
                                           int32_t count) {
  int32_t j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    // 16 columns of each phase from 16 * M padded columns, loaded straight from the row (masked to
    // its columns: the padding reads as zero) and picked by two-source permutes. Through a padded
    // copy of the row, the wide loads waited for the narrow stores that wrote it (3x slower).
    auto padded = [&](int32_t first) __attribute__((always_inline)) {  // padded columns first .. first + 15
      const int32_t lo = left - first > 0 ? left - first : 0, hi = W + left - first;
      const uint32_t below = hi <= 0 ? 0u : hi >= 16 ? 0xffffu : (1u << hi) - 1u;
      const __mmask16 lanes = (__mmask16)(lo >= 16 ? 0u : below & ~((1u << lo) - 1u));
      return lanes ? _mm512_maskz_loadu_ps(lanes, src + (first - left)) : _mm512_setzero_ps();
    };
    for (; j < count; j += 16) {
      __m512 v[M];
#pragma GCC unroll 4
      for (int q = 0; q < M; ++q) v[q] = padded(j * M + 16 * q);
#pragma GCC unroll 4
      for (int p = 0; p < M; ++p) {
        static_assert(M == 4, "the phases of F(4x4)");
        const __m512i pick = _mm512_set_epi32(28 + p, 24 + p, 20 + p, 16 + p, 12 + p, 8 + p, 4 + p, p, 28 + p, 24 + p,
                                              20 + p, 16 + p, 12 + p, 8 + p, 4 + p, p);
        const __m512 lo = _mm512_permutex2var_ps(v[0], pick, v[1]), hi = _mm512_permutex2var_ps(v[2], pick, v[3]);
        const __m512 phase = _mm512_shuffle_f32x4(lo, hi, 0x44);  // lanes 0-7 of lo, then lanes 0-7 of hi
        tessera_winograd_store_lanes(phases + p * count + j, (tessera_vf)phase, count - j < 16 ? count - j : 16);
      }
    }
  }
#endif
  for (; j < count; ++j) {
#pragma GCC unroll 4
    for (int p = 0; p < M; ++p) {
      const int32_t x = j * M + p - left;
      phases[p * count + j] = (uint32_t)x < (uint32_t)W ? tessera_to_float(src[x]) : 0.0f;
    }
  }
}

// The floats of the scratch a chunk of `tile_rows` rows of TW tiles uses (tessera_winograd_chunk).
template <int M>
static inline int64_t tessera_winograd_scratch(int32_t C, int32_t channels, int32_t tile_rows, int32_t TW) {
  const int A = M + 2, MR = TESSERA_GEMM_MR, VEC = TESSERA_GEMM_VEC;
  const int64_t tiles = (int64_t)tile_rows * TW, strips = (tiles + MR - 1) / MR;
  const int64_t ldm = (channels + VEC - 1) / VEC * VEC;
  const int64_t xph = (int64_t)(tile_rows * M + 2) * M * (TW + 1);
  return (xph + 15) / 16 * 16 + A * A * tessera_winograd_stride(strips * MR * C) +
         A * A * tessera_winograd_stride(tiles * ldm);
}

// One chunk: the outputs of `tile_rows` rows of TW tiles from output row oh0 (image rows), for the
// block's `channels` output channels, into acc (channel o's output row i at o * acc_stride + i *
// row_stride, row_stride >= round_up(TW * M, VEC)). x: the image's first channel of the group,
// C channels of H x W; u: the block's U (tessera_winograd_weights); scratch: tessera_winograd_scratch
// floats.
template <int M, typename T>
static inline void tessera_winograd_chunk(float *__restrict acc, int64_t acc_stride, int32_t row_stride,
                                          const float *__restrict u, float *__restrict scratch,
                                          const T *__restrict x, int32_t C, int32_t H, int32_t W, int32_t top,
                                          int32_t left, int32_t oh0, int32_t tile_rows, int32_t TW,
                                          int32_t channels) {
  using Mat = tessera_winograd_matrices<M>;
  const int A = M + 2, MR = TESSERA_GEMM_MR, NR = TESSERA_GEMM_NR, VEC = TESSERA_GEMM_VEC;
  static_assert(TESSERA_GEMM_MR <= TESSERA_GEMM_VEC, "a strip of tiles is computed in one vector");
  static_assert(TESSERA_GEMM_VEC % M == 0, "the tiles of a row make whole vectors of output columns");
  const int32_t tiles = tile_rows * TW, strips = (tiles + MR - 1) / MR, rows_in = tile_rows * M + 2;
  const int32_t TWs = TW + 1;  // a phase row: the columns the tiles read
  const int64_t ldm = (channels + VEC - 1) / VEC * VEC;
  const int64_t v_xi = tessera_winograd_stride((int64_t)strips * MR * C), m_xi = tessera_winograd_stride(tiles * ldm);
  const int64_t u_xi = tessera_winograd_u_stride(C, channels);
  float *xph = scratch;
  float *v = scratch + ((int64_t)rows_in * M * TWs + 15) / 16 * 16;
  float *mbuf = v + A * A * v_xi;

  // The input transform, channel by channel: xph, then V of every strip of MR tiles.
  const int32_t y0 = oh0 - top;  // the input row of the chunk's first padded row
  for (int32_t c = 0; c < C; ++c) {
    const T *plane = x + (int64_t)c * H * W;
    for (int32_t i = 0; i < rows_in; ++i) {
      float *dst = xph + (int64_t)i * M * TWs;
      const int32_t y = y0 + i;
      if ((uint32_t)y >= (uint32_t)H) {
        memset(dst, 0, sizeof(float) * (size_t)M * TWs);
        continue;
      }
      tessera_winograd_phases<M>(dst, plane + (int64_t)y * W, W, left, TWs);
    }
    for (int32_t s = 0; s < strips; ++s) {
      // The strip's tiles t0 .. t0 + live: runs of consecutive tiles of one tile row each.
      const int32_t t0 = s * MR, live = tiles - t0 < MR ? tiles - t0 : MR;
      int32_t run_lane[TESSERA_GEMM_MR], run_count[TESSERA_GEMM_MR], runs = 0;
      int64_t run_at[TESSERA_GEMM_MR];
      for (int32_t t = t0; t < t0 + live; ++runs) {
        const int32_t ty = t / TW, tx = t % TW, count = TW - tx < t0 + live - t ? TW - tx : t0 + live - t;
        run_lane[runs] = t - t0;
        run_count[runs] = count;
        run_at[runs] = (int64_t)ty * M * M * TWs + tx;
        t += count;
      }
      // Row j of each tile's window (in its lane), then z[j][k'] = sum_k BT[k'][k] d[j][k]. The loop over
      // j stays a loop: unrolled too, the routine took twice as long to compile.
      tessera_vf z[A * A];
#pragma GCC unroll 1
      for (int j = 0; j < A; ++j) {
        tessera_vf d[A];
#pragma GCC unroll 6
        for (int k = 0; k < A; ++k) {
          const float *at = xph + (int64_t)(j * M + k % M) * TWs + k / M;
          tessera_vf lanes = (tessera_vf){};
          for (int32_t r = 0; r < runs; ++r) lanes = tessera_winograd_load_lanes(lanes, at + run_at[r], run_lane[r], run_count[r]);
          d[k] = lanes;
        }
        tessera_winograd_apply(Mat::BT, d, 1, z + j * A, 1);
      }
      float *strip = v + (int64_t)s * C * MR + (int64_t)c * MR;
#pragma GCC unroll 6
      for (int k = 0; k < A; ++k) {
        tessera_vf out[A];
        tessera_winograd_apply(Mat::BT, z + k, A, out, 1);  // V[i][k] = sum_j BT[i][j] z[j][k]
#pragma GCC unroll 6
        for (int i = 0; i < A; ++i) tessera_winograd_store_lanes(strip + (i * A + k) * v_xi, out[i], MR);
      }
    }
  }

  // The A * A GEMMs: M_xi[0:tiles, 0:channels] = V_xi U_xi over the C channels.
  for (int xi = 0; xi < A * A; ++xi) {
    tessera_gemm_strips<float, tessera_gemm_micro<true>>(mbuf + xi * m_xi, ldm, v + xi * v_xi, u + xi * u_xi, tiles,
                                                          channels, C);
  }

  // The output transform: VEC / M tiles of a row (VEC output columns) for VEC channels at a time.
  const int G = VEC / M;
  for (int32_t ty = 0; ty < tile_rows; ++ty) {
    for (int32_t tx0 = 0; tx0 < TW; tx0 += G) {
      for (int32_t o0 = 0; o0 < channels; o0 += VEC) {
        tessera_vf y[M][VEC];  // y[a][q * M + b]: output row a, column b of tile q, VEC channels
        for (int q = 0; q < G; ++q) {
          if (tx0 + q >= TW) {
#pragma GCC unroll 4
            for (int a = 0; a < M; ++a)
#pragma GCC unroll 4
              for (int b = 0; b < M; ++b) y[a][q * M + b] = (tessera_vf){};
            continue;
          }
          const float *tile = mbuf + (int64_t)(ty * TW + tx0 + q) * ldm + o0;
          tessera_vf m[A * A], half[M * A];
#pragma GCC unroll 36
          for (int xi = 0; xi < A * A; ++xi) m[xi] = *(const tessera_vf_unaligned *)(tile + xi * m_xi);
          // half[a][k] = sum_i AT[a][i] m[i][k]; out[a][b] = sum_k AT[b][k] half[a][k]
#pragma GCC unroll 6
          for (int k = 0; k < A; ++k) tessera_winograd_apply(Mat::AT, m + k, A, half + k, A);
#pragma GCC unroll 4
          for (int a = 0; a < M; ++a) tessera_winograd_apply(Mat::AT, half + a * A, 1, &y[a][q * M], 1);
        }
        const int32_t live = channels - o0 < VEC ? channels - o0 : VEC;
#pragma GCC unroll 4
        for (int a = 0; a < M; ++a) {
          tessera_winograd_transpose(y[a]);
          float *out = acc + (int64_t)o0 * acc_stride + (int64_t)(ty * M + a) * row_stride + tx0 * M;
          for (int32_t l = 0; l < live; ++l) *(tessera_vf_unaligned *)(out + l * acc_stride) = y[a][l];
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------ entry points
// Called from the tile program through T.call_extern (tessera_tvm/tile/conv.py). The workspace: the
// block's U from `workspace`, `u_floats` floats (the tile program's bound, at least
// A * A * round_up(channels, NR) * C), then the chunk's scratch; `floats` in all.

template <int M>
static inline float *tessera_winograd_scratch_at(float *workspace, int64_t floats, int64_t u_floats, int32_t C,
                                                 int32_t channels, int32_t tile_rows, int32_t TW) {
  const int64_t u_need = (int64_t)(M + 2) * (M + 2) * tessera_winograd_u_stride(C, channels);
  if (u_need > u_floats || u_floats + tessera_winograd_scratch<M>(C, channels, tile_rows, TW) > floats) {
    fprintf(stderr, "tessera: the Winograd convolution's workspace (%lld floats) is too small\n", (long long)floats);
    abort();
  }
  return workspace + u_floats;
}

#define TESSERA_DEFINE_WINOGRAD(M, SUFFIX, T, STORAGE)                                                               \
  TESSERA_CPU_API int32_t tessera_cpu_winograd_weights_m##M##_##SUFFIX(float *u, T *w, int64_t offset,       \
                                                                                int32_t C, int32_t channels) {        \
    tessera_winograd_weights<M>(u, (const STORAGE *)w + offset, C, channels);                                        \
    return 0;                                                                                                          \
  }                                                                                                                    \
  TESSERA_CPU_API int32_t tessera_cpu_winograd_m##M##_##SUFFIX(                                               \
      float *acc, int64_t acc_stride, int32_t row_stride, float *workspace, int64_t floats, int64_t u_floats, T *x,  \
      int64_t offset, int32_t C, int32_t H, int32_t W, int32_t top, int32_t left, int32_t oh0, int32_t tile_rows,   \
      int32_t TW, int32_t channels) {                                                                                 \
    float *scratch = tessera_winograd_scratch_at<M>(workspace, floats, u_floats, C, channels, tile_rows, TW);        \
    tessera_winograd_chunk<M>(acc, acc_stride, row_stride, workspace, scratch, (const STORAGE *)x + offset, C, H, W, \
                              top, left, oh0, tile_rows, TW, channels);                                              \
    return 0;                                                                                                          \
  }

TESSERA_DEFINE_WINOGRAD(4, f32, float, float)
TESSERA_DEFINE_WINOGRAD(4, f16, half, tessera_half_bits)
TESSERA_DEFINE_WINOGRAD(4, bf16, uint16_t, uint16_t)
#undef TESSERA_DEFINE_WINOGRAD
