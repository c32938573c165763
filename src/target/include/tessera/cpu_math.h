// Math functions that g++ can vectorise, for the hot loops of CPU kernels (softmax, attention).
//
// libm's expf is an opaque call: a loop that calls it stays scalar (glibc's vector variants are
// declared only under -ffast-math, which would also break the -inf masking the kernels rely on).
// tessera_expf is inline, branch-free float arithmetic, so a loop over it becomes AVX-512/AVX2 code.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cpu_parallel.h"  // TESSERA_EXTERN_C

// exp(x) to within 2 ulp (Cephes' expf polynomial): x = k ln2 + r with |r| <= ln2 / 2 (ln2 split in
// two for an exact product), exp(r) by a degree-7 polynomial, times 2^k as two powers of two built
// in the exponent bits (so k from -150 to 128 needs no special case; denormal results are rounded).
// exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN.
TESSERA_EXTERN_C inline float tessera_expf(float x) {
  const float lowest = -103.972084f, highest = 88.7228394f;  // exp underflows to 0 / overflows to inf
  const float clamped = x < lowest ? lowest : (x > highest ? highest : x);
  // round(x / ln2) without a libm call: adding 1.5 * 2^23 rounds to nearest in the low mantissa bits.
  const float shifter = 12582912.0f;
  const float k = (clamped * 1.44269504088896341f + shifter) - shifter;
  float r = clamped - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const int32_t k_int = (int32_t)k, half = k_int >> 1;  // 2^k = 2^half * 2^(k - half), each normal
  const int32_t bits_lo = (half + 127) << 23, bits_hi = (k_int - half + 127) << 23;
  float scale_lo, scale_hi;
  memcpy(&scale_lo, &bits_lo, sizeof scale_lo);
  memcpy(&scale_hi, &bits_hi, sizeof scale_hi);
  float result = (y * scale_lo) * scale_hi;
  result = x < lowest ? 0.0f : result;
  result = x > highest ? __builtin_inff() : result;
  return x != x ? x : result;  // NaN in, NaN out
}
