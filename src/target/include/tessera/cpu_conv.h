// The convolution routines of Tessera's CPU convolution tile programs (tessera_tvm/tile/conv.py):
//
//   implicit GEMM  tessera_cpu_pack_a_conv_<dtype> packs the im2col rows of [N*OH*OW, C*R*S] x
//                  [C*R*S, O] straight from the input for the GEMM micro-kernel of cpu_gemm.h
//   depthwise      tessera_cpu_depthwise_f32 sums a window over a zero-padded input plane
//   direct         unit-stride convolutions with the GEMM's roles swapped: rows of the register tile
//                  are output channels (A = the weights), its vector columns output pixels read
//                  straight from a zero-padded copy of the input (B is never packed)
#pragma once

#include "cpu_gemm.h"

// ------------------------------------------------------------------------------------ convolution
// A 2-D convolution (NCHW input, OIHW weights) runs as the implicit GEMM [N*OH*OW, C*R*S] x
// [C*R*S, O] (tessera_tvm/tile/conv.py): the weights are B through the ordinary packing (k_stride 1,
// col_stride C*R*S), and A, the im2col matrix, is never built: this packs its rows row0.. and
// depth k0.. straight from the input, as strips of MR rows like tessera_pack_strips. Element (m, k)
// is x[n, c, oh*sh - ph + r*dh, ow*sw - pw + s*dw] for m = (n*OH + oh)*OW + ow and k = (c*R + r)*S + s,
// 0 where that falls in the padding. x + offset is the group's first channel (a grouped
// convolution packs each group's channels); C is the input's channel count (an image's stride).

template <typename T>
static inline void tessera_pack_conv(float *__restrict pack, const T *__restrict x, int32_t row0, int32_t k0,
                                     int32_t rows, int32_t depth, int32_t C, int32_t H, int32_t W, int32_t OH,
                                     int32_t OW, int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t ph, int32_t pw,
                                     int32_t dh, int32_t dw) {
  const int MR = TESSERA_GEMM_MR;
  int64_t image[TESSERA_GEMM_MR];  // per row of the strip: where its image starts, its window's corner
  int32_t top[TESSERA_GEMM_MR], left[TESSERA_GEMM_MR];
  for (int32_t i0 = 0; i0 < rows; i0 += MR) {
    float *strip = pack + (int64_t)i0 * depth;
    const int32_t live = rows - i0 < MR ? rows - i0 : MR;
    for (int i = 0; i < live; ++i) {
      const int32_t m = row0 + i0 + i, pixel = m % (OH * OW);
      image[i] = (int64_t)(m / (OH * OW)) * C * H * W;
      top[i] = pixel / OW * sh - ph;
      left[i] = pixel % OW * sw - pw;
    }
    // With a unit column stride, a strip whose pixels lie in one output row reads, for each k,
    // consecutive input elements of one input row: a straight copy between the padding columns.
    const bool one_row = sw == 1 && live == MR && image[0] == image[MR - 1] && top[0] == top[MR - 1];
    int32_t c = k0 / (R * S), r = k0 / S % R, s = k0 % S;
    for (int32_t k = 0; k < depth; ++k) {
      float *dst = strip + (int64_t)k * MR;
      const int64_t plane = (int64_t)c * H * W;
      int i = 0;
      if (one_row) {
        const int32_t y = top[0] + r * dh, first = left[0] + s * dw;
        if ((uint32_t)y >= (uint32_t)H) {
          for (; i < MR; ++i) dst[i] = 0.0f;
        } else {
          const T *row = x + image[0] + plane + (int64_t)y * W + first;
          const int32_t lo = first < 0 ? (-first < MR ? -first : MR) : 0;
          const int32_t hi = W - first < MR ? (W - first > lo ? W - first : lo) : MR;
          if (lo == 0 && hi == MR) {
            // No padding column in the window: a copy of constant length, which g++ turns into
            // vector moves (the loops below, of variable bounds, stay scalar).
#pragma GCC unroll 16
            for (int ii = 0; ii < MR; ++ii) dst[ii] = tessera_to_float(row[ii]);
            i = MR;
          }
          for (; i < lo; ++i) dst[i] = 0.0f;
          for (; i < hi; ++i) dst[i] = tessera_to_float(row[i]);
          for (; i < MR; ++i) dst[i] = 0.0f;
        }
      } else {
        for (; i < live; ++i) {
          const int32_t y = top[i] + r * dh, xx = left[i] + s * dw;
          const bool inside = (uint32_t)y < (uint32_t)H && (uint32_t)xx < (uint32_t)W;
          dst[i] = inside ? tessera_to_float(x[image[i] + plane + (int64_t)y * W + xx]) : 0.0f;
        }
        for (; i < MR; ++i) {
          dst[i] = 0.0f;
        }
      }
      if (++s == S) {
        s = 0;
        if (++r == R) {
          r = 0;
          ++c;
        }
      }
    }
  }
}

#define TESSERA_DEFINE_PACK_CONV(SUFFIX, T, STORAGE)                                                                \
  TESSERA_CPU_API int32_t tessera_cpu_pack_a_conv_##SUFFIX(                                                \
      float *pack, T *x, int64_t offset, int32_t row0, int32_t k0, int32_t rows, int32_t depth, int32_t C,          \
      int32_t H, int32_t W, int32_t OH, int32_t OW, int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t ph,       \
      int32_t pw, int32_t dh, int32_t dw) {                                                                        \
    tessera_pack_conv(pack, (const STORAGE *)x + offset, row0, k0, rows, depth, C, H, W, OH, OW, R, S, sh, sw, ph,  \
                      pw, dh, dw);                                                                                 \
    return 0;                                                                                                      \
  }

TESSERA_DEFINE_PACK_CONV(f32, float, float)
TESSERA_DEFINE_PACK_CONV(f16, half, tessera_half_bits)
TESSERA_DEFINE_PACK_CONV(bf16, uint16_t, uint16_t)
#undef TESSERA_DEFINE_PACK_CONV

// ------------------------------------------------------------------------------------ depthwise
// One output plane of a depthwise convolution (tessera_tvm/tile/conv.py): acc[oh * OW + ow] =
// sum over the window of w[r * S + s] * plane[(oh * sh + r * dh) * PW + ow * sw + s * dw], where
// `plane` is the zero-padded input plane (row stride PW) and w the window's fp32 weights. A segment
// of 2 * VEC outputs of a row stays in two vector registers for the whole window: per tap one
// broadcast weight and, with a unit column stride, two unaligned loads (sweeping a plane of
// accumulators once per tap loads and stores it every time: 7x7 ran at 0.81x torch).
// K: the window's side when the caller knows it is a K x K window at compile time (the tap loops
// unroll), else 0.
template <int K>
static inline void tessera_depthwise_plane(float *__restrict acc, const float *__restrict plane,
                                           const float *__restrict w, int32_t R, int32_t S, int32_t OH, int32_t OW,
                                           int32_t PW, int32_t sh, int32_t sw, int32_t dh, int32_t dw) {
  const int VEC = TESSERA_GEMM_VEC, B = 4;
  if (K) R = S = K;
  int32_t oh = 0;
  if (sh == 1 && sw == 1 && dh == 1 && OW >= VEC) {
    // B output rows at a time: output row b reads input row q = b + r, so each vector loaded from an
    // input row serves up to B taps, one per output row (one load per tap made the loads the limit).
    for (; oh + B <= OH; oh += B) {
      const float *rows = plane + (int64_t)oh * PW;
      for (int32_t ow = 0; ow < OW; ow += VEC) {
        const int32_t at = ow + VEC <= OW ? ow : OW - VEC;  // the last vector ends at the row's end
        tessera_vf sum[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) sum[b] = (tessera_vf){};
#pragma GCC unroll 10
        for (int32_t q = 0; q < R + B - 1; ++q) {
          const float *row = rows + (int64_t)q * PW + at;
#pragma GCC unroll 8
          for (int32_t s = 0; s < S; ++s) {
            const tessera_vf x = *(const tessera_vf_unaligned *)(row + s * dw);
#pragma GCC unroll 4
            for (int b = 0; b < B; ++b) {
              const int32_t r = q - b;
              if (r >= 0 && r < R) sum[b] += w[r * S + s] * x;
            }
          }
        }
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) *(tessera_vf_unaligned *)(acc + (int64_t)(oh + b) * OW + at) = sum[b];
      }
    }
  }
  for (; oh < OH; ++oh) {
    const float *rows = plane + (int64_t)oh * sh * PW;
    float *out = acc + (int64_t)oh * OW;
    int32_t ow = 0;
    if (sw == 1) {
      for (; ow + 2 * VEC <= OW; ow += 2 * VEC) {
        tessera_vf lo = (tessera_vf){}, hi = (tessera_vf){};
        for (int32_t r = 0; r < R; ++r) {
          const float *row = rows + (int64_t)r * dh * PW + ow;
          const float *taps = w + r * S;
#pragma GCC unroll 8
          for (int32_t s = 0; s < S; ++s) {
            lo += taps[s] * *(const tessera_vf_unaligned *)(row + s * dw);
            hi += taps[s] * *(const tessera_vf_unaligned *)(row + s * dw + VEC);
          }
        }
        *(tessera_vf_unaligned *)(out + ow) = lo;
        *(tessera_vf_unaligned *)(out + ow + VEC) = hi;
      }
      // The rest of the row, one vector at a time; the last vector ends at the row's end, recomputing
      // outputs of the one before (stored, not added, so an overlap is harmless).
      while (ow < OW && OW >= VEC) {
        ow = ow + VEC <= OW ? ow : OW - VEC;
        tessera_vf sum = (tessera_vf){};
        for (int32_t r = 0; r < R; ++r) {
          const float *row = rows + (int64_t)r * dh * PW + ow;
          const float *taps = w + r * S;
#pragma GCC unroll 8
          for (int32_t s = 0; s < S; ++s) {
            sum += taps[s] * *(const tessera_vf_unaligned *)(row + s * dw);
          }
        }
        *(tessera_vf_unaligned *)(out + ow) = sum;
        ow += VEC;
      }
    }
    for (; ow < OW; ++ow) {  // rows narrower than a vector, and every output of a strided convolution
      float sum = 0.0f;
      for (int32_t r = 0; r < R; ++r) {
        const float *row = rows + (int64_t)r * dh * PW + (int64_t)ow * sw;
        for (int32_t s = 0; s < S; ++s) {
          sum += w[r * S + s] * row[s * dw];
        }
      }
      out[ow] = sum;
    }
  }
}

TESSERA_CPU_API int32_t tessera_cpu_depthwise_f32(float *acc, float *plane, float *w, int32_t R, int32_t S,
                                                          int32_t OH, int32_t OW, int32_t PW, int32_t sh, int32_t sw,
                                                          int32_t dh, int32_t dw) {
  switch (R == S ? S : 0) {  // the usual square windows, with their tap loops unrolled
    case 3: tessera_depthwise_plane<3>(acc, plane, w, R, S, OH, OW, PW, sh, sw, dh, dw); break;
    case 5: tessera_depthwise_plane<5>(acc, plane, w, R, S, OH, OW, PW, sh, sw, dh, dw); break;
    case 7: tessera_depthwise_plane<7>(acc, plane, w, R, S, OH, OW, PW, sh, sw, dh, dw); break;
    default: tessera_depthwise_plane<0>(acc, plane, w, R, S, OH, OW, PW, sh, sw, dh, dw);
  }
  return 0;
}

// ------------------------------------------------------------------------------------ direct
// A convolution of one image and group (tessera_tvm/tile/conv.py: the direct program). A block
// copies the input rows its output rows read into `xpad`, a zero-padded fp32 buffer, split into
// phases by the strides: phase (a, b) holds the padded input's rows y = a, a + sh, ... and columns
// x = b, b + sw, ..., each phase row Wp = ceil(PW / sw) floats (PW = W + left + right), so that at
// k = (c, r, s) consecutive output pixels read consecutive floats (unit strides: one phase, the
// padded rows themselves). Only the phases some tap reads are kept (a 1x1 stride-2 window: one).
// The block computes its outputs on the phase-width grid: pixel p = oh * Wp + ow reads, at k,
// xpad[p + offset(k)], offset(k) = c * plane + phase(r, s) * phase_plane + (r * dh / sh) * Wp +
// s * dw / sw: the GEMM acc[o, p] = sum_k W[o, k] * xpad[p + offset(k)], the weights as A (strips
// of MR output channels), B read in place with one to three unaligned vector loads per k. Columns
// ow >= OW are computed and discarded (they read the next row, or the slack).
#if defined(__AVX512F__)
#define TESSERA_CONV_MR 8  // 8 x 3 accumulators: ResNet's channel counts (64, 128, ...) fill whole strips
#define TESSERA_CONV_NV 3
#else
#define TESSERA_CONV_MR TESSERA_GEMM_MR
#define TESSERA_CONV_NV TESSERA_GEMM_NV
#endif
#define TESSERA_CONV_TILE (TESSERA_CONV_NV * TESSERA_GEMM_VEC)  // pixels of the register tile
// The tile program keeps this many floats past a block's pixels in acc and past xpad's planes
// (tessera_tvm/tile/conv.py: DIRECT_SLACK): the last pixel tile runs past both.
#define TESSERA_CONV_SLACK 48
// K steps of one call at most (their offsets live on the stack; tile/conv.py: DIRECT_MAX_K).
#define TESSERA_CONV_MAX_DEPTH 4096
static_assert(TESSERA_CONV_TILE <= TESSERA_CONV_SLACK, "the tile program's slack is too small for this pixel tile");

// Whether some tap t < taps of a window (dilation `dilation`) reads phase `phase` of a stride.
static inline bool tessera_conv_phase_used(int32_t phase, int32_t taps, int32_t stride, int32_t dilation) {
  for (int32_t t = 0; t < taps; ++t) {
    if (t * dilation % stride == phase) return true;
  }
  return false;
}

// The kept phases below `phase` (phase = stride: how many are kept): the phase's place in xpad.
static inline int32_t tessera_conv_phase_rank(int32_t phase, int32_t taps, int32_t stride, int32_t dilation) {
  int32_t rank = 0;
  for (int32_t q = 0; q < phase; ++q) rank += tessera_conv_phase_used(q, taps, stride, dilation);
  return rank;
}

// c[r * ldc + 0:TILE] (Set: =, else +=) sum over k of A[r, k] * x[off[k] + 0:TILE], for the first
// `rows` rows. A is a packed strip (lda 0: A[r, k] at a[k * MR + r], zero past `rows`) or rows of
// the weights themselves (A[r, k] at a[r * lda + k]; rows past `rows` read row 0, not stored).
template <int MR, int NV, bool Set>
static inline void tessera_conv_micro(const float *__restrict a, int64_t lda, const float *__restrict x,
                                      const int32_t *__restrict off, int32_t depth, float *__restrict c, int64_t ldc,
                                      int32_t rows) {
  const int VEC = TESSERA_GEMM_VEC;
  tessera_vf sum[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) sum[r][v] = (tessera_vf){};
  }
  // A[r, k] at row[r][k * step]: a packed strip's rows interleaved (step MR), or the weights' rows
  // themselves (step 1). One loop for both (3x3 56x56 C=64 and the 7x7/2 stem ran as fast as with a
  // loop for each).
  const int64_t step = lda == 0 ? MR : 1;
  const float *row[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) row[r] = lda == 0 ? a + r : a + (r < rows ? r * lda : 0);
  for (int32_t k = 0; k < depth; ++k) {
    const float *xk = x + off[k];
    tessera_vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = *(const tessera_vf_unaligned *)(xk + v * VEC);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float w = row[r][k * step];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) sum[r][v] += w * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r < rows) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        tessera_vf_unaligned *dst = (tessera_vf_unaligned *)(c + r * ldc + v * VEC);
        *dst = Set ? sum[r][v] : *dst + sum[r][v];
      }
    }
  }
}

// acc[o * acc_stride + p] (set: =, else +=) the k steps k0 .. k0 + depth of the block's `channels`
// output channels at its padded pixels 0 .. pixels (rounded up to the pixel tile: acc and xpad hold
// the slack). The weights: packed strips (tessera_cpu_conv_pack_w_*, lda 0), or fp32 weights read in
// place, channel o's k step k0 at a[o * lda] (no packing: the strips' rows are contiguous in k).
template <bool Set>
static inline void tessera_conv_direct(float *__restrict acc, int64_t acc_stride, const float *__restrict a,
                                       int64_t lda, const float *__restrict xpad, int32_t k0, int32_t depth,
                                       int32_t channels, int32_t pixels, int64_t plane, int64_t phase_plane,
                                       int32_t Wp, int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t dh,
                                       int32_t dw) {
  const int MR = TESSERA_CONV_MR, NV = TESSERA_CONV_NV, TILE = TESSERA_CONV_TILE;
  int32_t off[TESSERA_CONV_MAX_DEPTH];  // depth <= TESSERA_CONV_MAX_DEPTH (tessera_cpu_conv_direct_f32)
  const int32_t col_phases = tessera_conv_phase_rank(sw, S, sw, dw);
  for (int32_t k = 0, c = k0 / (R * S), r = k0 / S % R, s = k0 % S; k < depth; ++k) {
    const int32_t phase = tessera_conv_phase_rank(r * dh % sh, R, sh, dh) * col_phases +
                          tessera_conv_phase_rank(s * dw % sw, S, sw, dw);
    off[k] = (int32_t)(c * plane + phase * phase_plane + (int64_t)(r * dh / sh) * Wp + s * dw / sw);
    if (++s == S) {
      s = 0;
      if (++r == R) {
        r = 0;
        ++c;
      }
    }
  }
  // Pixel tiles outside, channel strips inside: a tile's window (the k steps' inputs) stays in L1
  // for every strip. The last tile is one to NV vectors wide, whichever covers the pixels left
  // (a 7x7 plane's 63 padded pixels: 4 vectors, not 2 tiles of 3).
  const int VEC = TESSERA_GEMM_VEC;
  for (int32_t p = 0; p < pixels; p += TILE) {
    const int32_t left = pixels - p;
    for (int32_t o = 0; o < channels; o += MR) {
      const int32_t rows = channels - o < MR ? channels - o : MR;
      const float *strip = a + (lda ? o * lda : (int64_t)o * depth);
      float *c = acc + o * acc_stride + p;
      if (NV > 2 && left <= 2 * VEC) {
        if (left <= VEC) {
          tessera_conv_micro<MR, 1, Set>(strip, lda, xpad + p, off, depth, c, acc_stride, rows);
        } else {
          tessera_conv_micro<MR, 2, Set>(strip, lda, xpad + p, off, depth, c, acc_stride, rows);
        }
      } else {
        tessera_conv_micro<MR, NV, Set>(strip, lda, xpad + p, off, depth, c, acc_stride, rows);
      }
    }
  }
}

TESSERA_CPU_API int32_t tessera_cpu_conv_direct_f32(float *acc, int64_t acc_stride, float *a, int64_t a_offset,
                                                            int64_t lda, float *xpad, int32_t k0, int32_t depth,
                                                            int32_t channels, int32_t pixels, int64_t plane,
                                                            int64_t phase_plane, int32_t Wp, int32_t R, int32_t S,
                                                            int32_t sh, int32_t sw, int32_t dh, int32_t dw,
                                                            int32_t set) {
  if (depth > TESSERA_CONV_MAX_DEPTH) return -1;  // the tile program refuses such a block_k
  if (set) {
    tessera_conv_direct<true>(acc, acc_stride, a + a_offset, lda, xpad, k0, depth, channels, pixels, plane,
                              phase_plane, Wp, R, S, sh, sw, dh, dw);
  } else {
    tessera_conv_direct<false>(acc, acc_stride, a + a_offset, lda, xpad, k0, depth, channels, pixels, plane,
                               phase_plane, Wp, R, S, sh, sw, dh, dw);
  }
  return 0;
}

// xpad for output rows oh0.. of one image's `channels` channels (x: its first channel, planes of
// H x W): for each channel and kept phase (a, b), rows i < phase_plane / Wp of element
// x[c, (oh0 + i) * sh + a - top, j * sw + b - left] (0 outside the image), j < Wp; then `slack`
// zeros. Converts fp16/bf16 to fp32.
template <typename T>
static inline void tessera_conv_rows(float *__restrict xpad, const T *__restrict x, int32_t channels, int32_t H,
                                     int32_t W, int32_t oh0, int64_t plane, int64_t phase_plane, int32_t Wp,
                                     int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t dh, int32_t dw,
                                     int32_t top, int32_t left, int32_t slack) {
  const int32_t rows = (int32_t)(phase_plane / Wp), col_phases = tessera_conv_phase_rank(sw, S, sw, dw);
  for (int32_t c = 0; c < channels; ++c) {
    for (int32_t a = 0; a < sh; ++a) {
      if (!tessera_conv_phase_used(a, R, sh, dh)) continue;
      for (int32_t b = 0; b < sw; ++b) {
        if (!tessera_conv_phase_used(b, S, sw, dw)) continue;
        const int32_t phase = tessera_conv_phase_rank(a, R, sh, dh) * col_phases + tessera_conv_phase_rank(b, S, sw, dw);
        float *dst_plane = xpad + c * plane + phase * phase_plane;
        for (int32_t i = 0; i < rows; ++i) {
          float *dst = dst_plane + (int64_t)i * Wp;
          const int32_t y = (oh0 + i) * sh + a - top;
          if ((uint32_t)y >= (uint32_t)H) {
            memset(dst, 0, sizeof(float) * (size_t)Wp);
            continue;
          }
          const T *src = x + ((int64_t)c * H + y) * W;
          if (sw == 1) {  // the padded row: zeros, the row, zeros
            const int32_t right = Wp - left - W;
            for (int32_t j = 0; j < left; ++j) dst[j] = 0.0f;
            for (int32_t j = 0; j < W; ++j) dst[left + j] = tessera_to_float(src[j]);
            for (int32_t j = 0; j < right; ++j) dst[left + W + j] = 0.0f;
            continue;
          }
          for (int32_t j = 0; j < Wp; ++j) {
            const int32_t xx = j * sw + b - left;
            dst[j] = (uint32_t)xx < (uint32_t)W ? tessera_to_float(src[xx]) : 0.0f;
          }
        }
      }
    }
  }
  memset(xpad + channels * plane, 0, sizeof(float) * (size_t)slack);
}

// Weights as A strips of TESSERA_CONV_MR output channels (rows `row_stride` = C/g*R*S apart, k
// contiguous), as tessera_cpu_pack_a_* packs TESSERA_GEMM_MR.
#define TESSERA_DEFINE_CONV_DIRECT(SUFFIX, T, STORAGE)                                                          \
  TESSERA_CPU_API int32_t tessera_cpu_conv_rows_##SUFFIX(                                                  \
      float *xpad, T *x, int64_t offset, int32_t channels, int32_t H, int32_t W, int32_t oh0, int64_t plane,          \
      int64_t phase_plane, int32_t Wp, int32_t R, int32_t S, int32_t sh, int32_t sw, int32_t dh, int32_t dw,          \
      int32_t top, int32_t left, int32_t slack) {                                                                    \
    tessera_conv_rows(xpad, (const STORAGE *)x + offset, channels, H, W, oh0, plane, phase_plane, Wp, R, S, sh, sw,  \
                      dh, dw, top, left, slack);                                                                     \
    return 0;                                                                                                        \
  }                                                                                                                  \
  TESSERA_CPU_API int32_t tessera_cpu_conv_pack_w_##SUFFIX(float *pack, T *w, int64_t offset,                 \
                                                                   int64_t row_stride, int32_t rows, int32_t depth) {  \
    tessera_pack_strips<TESSERA_CONV_MR>(pack, (const STORAGE *)w + offset, row_stride, 1, rows, depth);              \
    return 0;                                                                                                          \
  }

TESSERA_DEFINE_CONV_DIRECT(f32, float, float)
TESSERA_DEFINE_CONV_DIRECT(f16, half, tessera_half_bits)
TESSERA_DEFINE_CONV_DIRECT(bf16, uint16_t, uint16_t)
#undef TESSERA_DEFINE_CONV_DIRECT
