#include "runtime/thread_pool.h"

#include "runtime/blas_kernels.h"

#include <cblas.h>
#include <spdlog/spdlog.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mpq::rt {

namespace {
thread_local int t_loop_depth = 0;

struct LoopDepth {
  LoopDepth() { ++t_loop_depth; }
  ~LoopDepth() { --t_loop_depth; }
};
}  // namespace

namespace {

// The CPUs of every OpenMP place; empty where OpenMP binds nothing (no OMP_PROC_BIND, OMP_PLACES
// or GOMP_CPU_AFFINITY), since libgomp then makes no places.
bool openmp_place_cpus(cpu_set_t* set) {
  CPU_ZERO(set);
  const int places = omp_get_num_places();
  for (int p = 0; p < places; ++p) {
    std::vector<int> ids(static_cast<size_t>(std::max(omp_get_place_num_procs(p), 0)));
    if (!ids.empty()) omp_get_place_proc_ids(p, ids.data());
    for (int id : ids)
      if (id >= 0 && id < CPU_SETSIZE) CPU_SET(id, set);
  }
  return CPU_COUNT(set) > 0;
}

}  // namespace

int allowed_cpus() {
  // Where OpenMP binds threads, libgomp has already pinned this (the initial) thread to the first
  // place, so its own mask says one CPU; the places are what the team may use.
  cpu_set_t set;
  if (openmp_place_cpus(&set)) return CPU_COUNT(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int hardware_threads() { return allowed_cpus(); }

void widen_affinity_to_openmp_places() {
  cpu_set_t set;
  if (openmp_place_cpus(&set)) sched_setaffinity(0, sizeof set, &set);
}

ThreadPool::ThreadPool(int threads) : threads_(threads <= 0 ? hardware_threads() : threads) {
  // More threads than CPUs: they take turns on the same cores, and every barrier waits for a
  // thread that is not running (slower than fewer threads). Said once per process.
  static std::atomic<bool> warned{false};
  const int cpus = allowed_cpus();
  if (threads_ > cpus && !warned.exchange(true))
    spdlog::warn("{} threads asked for, but this process may run on {} CPU(s) (its affinity mask or OpenMP places): "
                 "the threads will take turns; --threads {} avoids that",
                 threads_, cpus, cpus);
  // OpenBLAS's own threads would compete with this pool's for the same cores (and spin after each
  // GEMM); large GEMMs are split over the pool instead (runtime/cpu/conv_common.h). The setting is
  // global to the process, and the same for every pool.
  openblas_set_num_threads(1);
  // Every GEMM the kernels run goes through a pool; the first one repairs OpenBLAS's kernel choice
  // on CPUs it does not know (runtime/blas_kernels.h) before any of them runs.
  ensure_blas_kernels();
}

bool ThreadPool::inside_parallel_loop() { return t_loop_depth > 0 || omp_in_parallel() != 0; }

void ThreadPool::parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = static_cast<int64_t>(threads_) * 4;
  const int64_t chunk = std::max(grain, (n + max_chunks - 1) / max_chunks);
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (threads_ == 1 || chunks == 1 || inside_parallel_loop()) {
    LoopDepth depth;
    fn(0, n);
    return;
  }
  // Chunks are handed out in order from one counter, so a thread that starts late (or not at all,
  // on a busy machine) only takes fewer of them; the chunk boundaries never depend on timing.
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  const int team = static_cast<int>(std::min<int64_t>(threads_, chunks));
#pragma omp parallel num_threads(team)
  {
    LoopDepth depth;
    for (;;) {
      const int64_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) break;
      try {
        fn(begin, std::min(n, begin + chunk));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next.store(n, std::memory_order_relaxed);  // the loop is failing: hand out no more chunks
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::run_per_thread(int n, FunctionRef<void(int)> fn) {
  if (n <= 0) return;
  if (threads_ == 1 || n == 1 || inside_parallel_loop()) {
    LoopDepth depth;
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mu;
  const int team = std::min(threads_, n);
#pragma omp parallel num_threads(team)
  {
    LoopDepth depth;
    // OpenMP may give fewer threads than asked for: each takes every team-th task.
    for (int i = omp_get_thread_num(); i < n; i += omp_get_num_threads()) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mpq::rt
