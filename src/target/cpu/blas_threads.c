// OpenBLAS's parallel work on the OpenMP threads of Tessera's CPU kernels (src/target/cpu/blas_threads.py).
//
// A pthreads build of OpenBLAS (numpy's and scipy's wheels) runs a threaded call on its own worker
// threads, which keep spinning for about 0.1 s after the call; a Tessera kernel started in that time
// shares the cores with them (measured: 0.68-0.85x of its time alone on 2 cores). OpenBLAS (0.3.27
// and later) lets the caller run the call's jobs instead: openblas_set_threads_callback_function(cb)
// makes every threaded call hand its `numjobs` jobs to cb, which must run dojob(i, job i, data) for
// each i, all at the same time (the jobs of a level-3 call wait for one another's packed panels), and
// return when they are done. tessera_blas_run_jobs runs them as one OpenMP team, so BLAS and the
// kernels use the same threads, which spin only briefly (libgomp's default) and never fight.
//
// Built with -fopenmp against the libgomp the kernels load. Two guards:
// - where OpenMP gives a smaller team than there are jobs (a call from inside a parallel region,
//   OMP_THREAD_LIMIT), the jobs beyond the team run on threads started for them, never one after
//   another on one thread (which would deadlock);
// - one call at a time: a job without its own buffer uses OpenBLAS's buffer of its index, which two
//   concurrent calls (numpy from two Python threads) would share.
#include <omp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*tessera_blas_dojob)(int thread_num, void *jobdata, int dojob_data);

static pthread_mutex_t tessera_blas_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tessera_blas_calls = 0;     // threaded calls run here (read by the tests)
static uint64_t tessera_blas_spawned = 0;   // jobs that needed a thread of their own

struct tessera_blas_job {
  tessera_blas_dojob dojob;
  int index;
  void *data;
  int dojob_data;
  pthread_t thread;
};

static void *tessera_blas_job_thread(void *arg) {
  struct tessera_blas_job *job = (struct tessera_blas_job *)arg;
  job->dojob(job->index, job->data, job->dojob_data);
  return NULL;
}

static void tessera_blas_give_up(const char *what) {
  fprintf(stderr, "tessera: cannot run OpenBLAS's jobs at the same time (%s); stopping rather than hanging\n", what);
  abort();
}

// Jobs [first, numjobs) on threads of their own while this thread runs job `mine`, then the join.
// The jobs must run at the same time, so where a thread cannot be had the process stops with a
// message (as OpenBLAS does when it cannot create its own threads) instead of hanging.
static void tessera_blas_run_rest(tessera_blas_dojob dojob, int first, int numjobs, size_t elsize, char *jobdata,
                                  int dojob_data, int mine) {
  int count = numjobs - first;
  struct tessera_blas_job *jobs = (struct tessera_blas_job *)calloc((size_t)count, sizeof *jobs);
  if (jobs == NULL) {
    tessera_blas_give_up("out of memory");
  }
  for (int i = 0; i < count; ++i) {
    jobs[i].dojob = dojob;
    jobs[i].index = first + i;
    jobs[i].data = jobdata + (size_t)(first + i) * elsize;
    jobs[i].dojob_data = dojob_data;
    if (pthread_create(&jobs[i].thread, NULL, tessera_blas_job_thread, &jobs[i]) != 0) {
      tessera_blas_give_up("pthread_create failed");
    }
  }
  __atomic_add_fetch(&tessera_blas_spawned, (uint64_t)count, __ATOMIC_RELAXED);
  dojob(mine, jobdata + (size_t)mine * elsize, dojob_data);
  for (int i = 0; i < count; ++i) {
    pthread_join(jobs[i].thread, NULL);
  }
  free(jobs);
}

// The OpenBLAS threads callback (openblas_threads_callback in cblas.h).
void tessera_blas_run_jobs(int sync, tessera_blas_dojob dojob, int numjobs, size_t elsize, void *jobdata,
                           int dojob_data) {
  (void)sync;  // OpenBLAS always asks to wait
  char *jobs = (char *)jobdata;
  pthread_mutex_lock(&tessera_blas_lock);
  ++tessera_blas_calls;
  if (numjobs <= 1) {
    if (numjobs == 1) {
      dojob(0, jobs, dojob_data);
    }
    pthread_mutex_unlock(&tessera_blas_lock);
    return;
  }
#pragma omp parallel num_threads(numjobs)
  {
    int team = omp_get_num_threads();
    int me = omp_get_thread_num();
    if (team < numjobs && me == 0) {
      // A smaller team: the others run theirs, thread 0 starts threads for jobs [team, numjobs).
      tessera_blas_run_rest(dojob, team, numjobs, elsize, jobs, dojob_data, 0);
    } else {
      dojob(me, jobs + (size_t)me * elsize, dojob_data);
    }
  }
  pthread_mutex_unlock(&tessera_blas_lock);
}

uint64_t tessera_blas_calls_run(void) { return __atomic_load_n(&tessera_blas_calls, __ATOMIC_RELAXED); }

uint64_t tessera_blas_jobs_spawned(void) { return __atomic_load_n(&tessera_blas_spawned, __ATOMIC_RELAXED); }
