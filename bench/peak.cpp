// The machine's arithmetic peak, for bench.py's "of peak" column: an FMA-bound loop in f32, where
// the CPU has AVX512-BF16 a loop of bf16 dot products (vdpbf16ps), where it has AVX512-VNNI one of
// int8 dot products (vpdpbusd), and where it has AMX loops of tile dot products (tdpbf16ps,
// tdpbssd), each on `threads` threads.
//
//   peak <threads> <seconds>   prints "f32", "bf16", "int8", "amx_bf16" and "amx_int8", each with its
//                              G(FL)OP/s (0 where the CPU, or Linux for AMX, has no such unit)
//
// Each thread keeps 12 independent accumulator registers so the FMA latency is hidden behind the
// throughput (the chain loop fully unrolled, so they stay in registers); the multiplier and addend are read from volatile memory so the compiler cannot fold the
// loop. Built by bench/peak.py with g++ -O2 -march=native.
#include <immintrin.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int kChains = 12;
constexpr long kInner = 1 << 16;

#if defined(__AVX512F__)
using vec = __m512;
constexpr int kLanes = 16;
inline vec splat(float x) { return _mm512_set1_ps(x); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int kLanes = 8;
inline vec splat(float x) { return _mm256_set1_ps(x); }
inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float sum(vec v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
#else
#error "bench/peak.cpp needs AVX2+FMA or AVX-512"
#endif

volatile float g_mul = 0.999999f, g_add = 1e-7f;

// The chain loop of one thread: kChains accumulators of type V from `start(i)`, each advanced by
// `step` kInner times a block, for `blocks` blocks; their `total`s go to `sink` so nothing is dead.
// Returns the operations done, `per_step` a step.
template <typename V, typename Start, typename Step, typename Total>
double chain_loop(long blocks, float* sink, Start start, Step step, Total total, double per_step) {
  V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = start(i);
  for (long b = 0; b < blocks; ++b) {
    for (long k = 0; k < kInner; ++k) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) acc[i] = step(acc[i]);
    }
  }
  float s = 0;
  for (int i = 0; i < kChains; ++i) s += total(acc[i]);
  *sink = s;
  return per_step * kChains * kInner * double(blocks);
}

double f32_loop(long blocks, float* sink) {
  const vec m = splat(g_mul), a = splat(g_add);
  return chain_loop<vec>(
      blocks, sink, [](int i) { return splat(float(i)); }, [=](vec v) { return fma(v, m, a); },
      [](vec v) { return sum(v); }, 2.0 * kLanes);
}

#if defined(__AVX512BF16__)
double bf16_loop(long blocks, float* sink) {  // 16 lanes, 2 products + 2 adds each
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(g_mul), _mm512_set1_ps(g_add));
  return chain_loop<__m512>(
      blocks, sink, [](int i) { return _mm512_set1_ps(float(i)); }, [=](__m512 v) { return _mm512_dpbf16_ps(v, x, x); },
      [](__m512 v) { return _mm512_reduce_add_ps(v); }, 4.0 * 16);
}
#endif

#if defined(__AVX512VNNI__)
double int8_loop(long blocks, float* sink) {  // vpdpbusd: 64 byte products (and their adds) a vector
  const __m512i x = _mm512_set1_epi8(static_cast<char>(int(g_add * 1e7f)));
  return chain_loop<__m512i>(
      blocks, sink, [](int i) { return _mm512_set1_epi32(i); }, [=](__m512i v) { return _mm512_dpbusd_epi32(v, x, x); },
      [](__m512i v) { return float(_mm512_reduce_add_epi32(v)); }, 2.0 * 64);
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
// AMX: tdpbf16ps on four 16 x 16 fp32 accumulator tiles from two A and two B tiles that stay in the
// tile registers (16 rows x 32 bf16 each): 16 * 16 * 32 * 2 FLOPs an instruction.
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool amx_granted() {  // Linux hands a process the tile registers only when asked
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

template <bool Int8>
double amx_loop(long blocks, float* sink) {
  TileConfig config = {};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  alignas(64) static thread_local uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3f80;  // 1.0
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const long inner = kInner / 16;
  for (long b = 0; b < blocks; ++b) {
    for (long k = 0; k < inner; ++k) {
      if (Int8) {  // 16 x 16 x 64 byte products
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      } else {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  *sink = out[0];
  return 4.0 * 16 * 16 * (Int8 ? 64 : 32) * 2 * double(inner) * double(blocks);
}
#endif

// GFLOP/s of `loop` on `threads` threads: each first times one block, then runs blocks for ~seconds.
template <typename Loop>
double measure(Loop loop, int threads, double seconds) {
  float sink = 0;
  auto t0 = std::chrono::steady_clock::now();
  loop(1, &sink);
  const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long blocks = std::max(1L, long(seconds / std::max(one, 1e-6)));
  std::vector<std::thread> pool;
  std::vector<double> flops(threads);
  std::vector<float> sinks(threads);
  std::atomic<int> ready{0};
  t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) {
      }
      flops[t] = loop(blocks, &sinks[t]);
    });
  }
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double total = 0;
  for (int t = 0; t < threads; ++t) total += flops[t] + 0.0f * sinks[t];
  return total / elapsed / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;
  if (threads < 1 || seconds <= 0) {
    std::fprintf(stderr, "usage: peak <threads >= 1> <seconds > 0>\n");
    return 2;
  }
  std::printf("f32 %.1f\n", measure(f32_loop, threads, seconds));
#if defined(__AVX512BF16__)
  std::printf("bf16 %.1f\n", measure(bf16_loop, threads, seconds));
#else
  std::printf("bf16 0\n");
#endif
#if defined(__AVX512VNNI__)
  std::printf("int8 %.1f\n", measure(int8_loop, threads, seconds));
#else
  std::printf("int8 0\n");
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__linux__)
  const bool granted = amx_granted();
  std::printf("amx_bf16 %.1f\n", granted ? measure(amx_loop<false>, threads, seconds) : 0.0);
  std::printf("amx_int8 %.1f\n", granted ? measure(amx_loop<true>, threads, seconds) : 0.0);
#else
  std::printf("amx_bf16 0\namx_int8 0\n");
#endif
  return 0;
}
