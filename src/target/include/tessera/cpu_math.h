// Math functions that g++ can vectorise, for the hot loops of CPU kernels (softmax, attention).
//
// libm's expf is an opaque call: a loop that calls it stays scalar (glibc's vector variants are
// declared only under -ffast-math, which would also break the -inf masking the kernels rely on).
// tessera_expf is inline, branch-free float arithmetic, so a loop over it becomes AVX-512/AVX2 code.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cpu_parallel.h"  // TESSERA_EXTERN_C

// exp(x) = 2^k exp(r) for x in float range: returns exp(r) and sets k, with x = k ln2 + r, |r| <= ln2 / 2
// (ln2 split in two for an exact product), exp(r) by Cephes' degree-7 expf polynomial.
static inline float tessera_exp_reduced(float x, float *k_out) {
  // round(x / ln2) without a libm call: adding 1.5 * 2^23 rounds to nearest in the low mantissa bits.
  const float shifter = 12582912.0f;
  const float k = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  *k_out = k;
  return p * (r * r) + r + 1.0f;
}

// 2^k for an integer k in [-126, 127], built in the exponent bits.
static inline float tessera_exp2_int(int32_t k) {
  const int32_t bits = (k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return scale;
}

// exp(x) to within 2 ulp: tessera_exp_reduced times 2^k as two powers of two (so k from -150 to 128
// needs no special case; denormal results are rounded). exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN.
TESSERA_EXTERN_C inline float tessera_expf(float x) {
  const float lowest = -103.972084f, highest = 88.7228394f;  // exp underflows to 0 / overflows to inf
  float k;
  const float y = tessera_exp_reduced(x < lowest ? lowest : (x > highest ? highest : x), &k);
  const int32_t k_int = (int32_t)k, half = k_int >> 1;  // 2^k = 2^half * 2^(k - half), each normal
  float result = (y * tessera_exp2_int(half)) * tessera_exp2_int(k_int - half);
  result = x < lowest ? 0.0f : result;
  result = x > highest ? __builtin_inff() : result;
  return x != x ? x : result;  // NaN in, NaN out
}

// exp(x) for x <= 0, the exponent of a softmax (a score minus its row's max), to within 1 ulp where
// exp(x) is a normal float: tessera_expf without its overflow and denormal cases (one power of two).
// x below ln(2^-126) (and -inf: a masked score) gives 0, NaN stays NaN; x > 0 is outside its range
// (2^k may overflow). About 30% fewer instructions per vector than tessera_expf.
TESSERA_EXTERN_C inline float tessera_expf_nonpositive(float x) {
  const float lowest = -87.3365448f;  // ln(2^-126): 2^k below is no normal float
  float k;
  const float y = tessera_exp_reduced(x < lowest ? lowest : x, &k);
  const float result = x < lowest ? 0.0f : y * tessera_exp2_int((int32_t)k);  // k in [-126, 0]
  return x != x ? x : result;  // NaN in, NaN out
}

// erf(x) to within 3.3e-7 absolute: x P(x^2) / Q(x^2) with P of degree 6 and Q of degree 5, a
// rational fit made for Tessera (least squares reweighted towards the largest error, on [0, 3.92],
// where float32 erf reaches 1), x clamped to +-3.92 and the result to [-1, 1]. No exp: one division
// and 12 fused multiply-adds, which g++ vectorises. GELU reads it through 0.5 x (1 + erf(x / sqrt 2)).
TESSERA_EXTERN_C inline float tessera_erff(float x) {
  const float c = 3.92f;
  const float xc = x > c ? c : (x < -c ? -c : x);
  const float t = xc * xc;
  float p = -1.3337085325e-08f;
  p = p * t + 4.7180229530e-06f;
  p = p * t + 3.8037877133e-04f;
  p = p * t + 3.8323758020e-03f;
  p = p * t + 5.4278441478e-02f;
  p = p * t + 1.8470052940e-01f;
  p = p * t + 1.1283791808e+00f;
  float q = 6.3421089942e-05f;
  q = q * t + 1.3050384620e-03f;
  q = q * t + 1.5430967079e-02f;
  q = q * t + 1.1377548004e-01f;
  q = q * t + 4.9702011085e-01f;
  q = q * t + 1.0f;
  const float r = xc * p / q;
  const float result = r > 1.0f ? 1.0f : (r < -1.0f ? -1.0f : r);
  return x != x ? x : result;  // NaN in, NaN out
}

// tanh(x): odd Taylor polynomial below |x| = 0.25 (relative error < 1e-8 there, where the formula
// below would cancel), else 1 - 2 / (exp(2|x|) + 1) (absolute error ~1e-7), sign restored. exp
// overflowing to inf gives exactly +-1.
TESSERA_EXTERN_C inline float tessera_tanhf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float x2 = x * x;
  const float small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * (-0.053968254f + x2 * 0.021869489f))));
  const float large = 1.0f - 2.0f / (tessera_expf(2.0f * a) + 1.0f);
  const float result = a < 0.25f ? small : (x < 0.0f ? -large : large);
  return x != x ? x : result;
}

// max(x, y) and min(x, y) that are NaN when either is NaN, as torch.maximum / torch.minimum
// (fmaxf and `x > y ? x : y` drop a NaN). Both operands are read before the selects, which g++
// vectorises (tessera_tvm/tile/common.py: nan_max, for the max reductions of CPU kernels).
TESSERA_EXTERN_C inline float tessera_nan_maxf(float x, float y) {
  const float larger = y < x ? x : y;  // y when either is NaN
  return x != x ? x : larger;
}

TESSERA_EXTERN_C inline float tessera_nan_minf(float x, float y) {
  const float smaller = x < y ? x : y;  // y when either is NaN
  return x != x ? x : smaller;
}
