// The kernel grid of a CPU kernel as one OpenMP parallel region.
//
// tessera.LowerParallelGrid turns the grid loops of a kernel into
//
//     TESSERA_PARALLEL_BEGIN(blocks);                      // a team of tessera_team_size(blocks) threads
//     <the blocks' local arrays>                           // declared inside: private to each thread
//     for (int32_t claim = 0; claim < blocks; ++claim) {
//       int32_t block = TESSERA_NEXT_BLOCK();              // claim a block (shared atomic counter)
//       if (block >= blocks) { break; }
//       int32_t bx = block / ny;  int32_t by = block % ny; // the grid indices of the block
//       <the block's body>
//     }
//     TESSERA_PARALLEL_END();
//
// The two region macros open and close a block statement around the region; the pass emits them as
// a pair in one statement list, so the braces always match. Without -fopenmp the pragma is ignored and
// the region runs on the calling thread, which claims every block in order.
#pragma once

#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __cplusplus
#define TESSERA_EXTERN_C extern "C"
#else
#define TESSERA_EXTERN_C
#endif

// The entries kernels call (packing, micro-kernels, convolutions; cpu_api.h declares them): inline,
// so that a source including tessera/cpu.h is self-contained. Tessera's builds compile them once per
// flag set into the runtime objects (TESSERA_CPU_RUNTIME_BUILD: each emitted whether called or not,
// hidden, merged where two objects hold one) and compile kernels against their declarations alone
// (TESSERA_CPU_RUNTIME_LINKED, tessera/cpu.h): a GEMM kernel's g++ took ~0.45 s and takes ~0.15 s.
#if defined(TESSERA_CPU_RUNTIME_BUILD)
#define TESSERA_CPU_API TESSERA_EXTERN_C inline __attribute__((used))
#else
#define TESSERA_CPU_API TESSERA_EXTERN_C inline
#endif

// Most threads a kernel launch uses: TESSERA_NUM_THREADS when it is a positive integer, else
// OpenMP's default (OMP_NUM_THREADS, else one per core). Read at every launch, so a process may
// change it between calls.
static inline int32_t tessera_max_threads(void) {
  const char *env = getenv("TESSERA_NUM_THREADS");
  if (env != NULL && *env != '\0') {
    char *end = NULL;
    long n = strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0) {
      return n > 1024 ? 1024 : (int32_t)n;
    }
  }
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Threads for a grid of `blocks` blocks: never more than there are blocks (a grid of one block runs
// on the calling thread, with its full stack).
static inline int32_t tessera_team_size(int64_t blocks) {
  int32_t threads = tessera_max_threads();
  if (blocks < 1) {
    return 1;
  }
  return blocks < threads ? (int32_t)blocks : threads;
}

// This thread's index in the current team, and the team's size (0 and 1 outside a region).
TESSERA_EXTERN_C inline int32_t tessera_thread_index(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

TESSERA_EXTERN_C inline int32_t tessera_thread_count(void) {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// tessera_next_block is declared outside the parallel construct, so the team shares it.
#define TESSERA_PARALLEL_BEGIN(blocks)                                                             \
  {                                                                                                \
    const int32_t tessera_team = tessera_team_size(blocks);                                        \
    int32_t tessera_next_block = 0;                                                                \
    _Pragma("omp parallel num_threads(tessera_team) if(tessera_team > 1)") {
#define TESSERA_NEXT_BLOCK() __atomic_fetch_add(&tessera_next_block, 1, __ATOMIC_RELAXED)
#define TESSERA_PARALLEL_END()                                                                     \
  }                                                                                                \
  }
