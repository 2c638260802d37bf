#pragma once
// The kernel thread pool: data-parallel loops on OpenMP. parallel_for splits [0, n) into contiguous
// chunks of at least `grain` items; the calling thread takes part.
//
// Why OpenMP rather than threads of mpq's own: oneDNN (Debian's build) runs its convolutions on
// OpenMP, so with a pool of mpq's own there were two sets of worker threads competing for the same
// cores, and each had to sleep between jobs so as not to starve the other (a futex wake-up, about
// 15 us, per parallel loop). On one OpenMP team, mpq's loops and oneDNN's primitives use the same
// threads, which may then spin briefly between jobs (GOMP_SPINCOUNT, set by apps/mpq/main.cpp) as
// ONNX Runtime's do. OpenBLAS keeps threads of its own, so the executor runs it on one thread and
// splits large GEMMs over this pool (runtime/cpu/conv_common.h, blas_gemm_rows).
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace mpq::rt {

// A non-owning reference to a callable, for loop bodies that run before the call returns. A
// std::function holding a lambda that captures more than two references allocates on the heap;
// with one parallel loop or more per node, that was a malloc and a free per node on every run
// (a small model's runs are 30-70 us; see ThreadPool::parallel_for).
template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // Any callable object (a lambda, a functor, a std::function); not a bare function name, whose
  // address is not an object pointer (wrap it in a lambda).
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    !std::is_function_v<std::remove_reference_t<F>> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): takes lambdas as std::function did
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          auto& callable = *static_cast<std::remove_reference_t<F>*>(object);
          if constexpr (std::is_void_v<R>) {
            callable(std::forward<Args>(args)...);  // a result, if any, is dropped as std::function does
          } else {
            return callable(std::forward<Args>(args)...);
          }
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per hardware thread
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // Runs fn over [0, n) in chunks on up to size() threads and returns when all are done; the first
  // exception thrown by a chunk is rethrown here. A call from inside a parallel loop (a kernel
  // calling another) and a job of one chunk run on the calling thread.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t begin, int64_t end)> fn);
  // Runs fn(0) ... fn(n - 1), task i on team thread i (with fewer threads than tasks, a thread
  // takes every team-th task), and returns when all are done; the first exception is rethrown
  // here. Unlike parallel_for's chunks, handed out from a counter, the assignment is fixed: the
  // same OpenMP thread (usually on the same core: threads are not pinned) runs task i on every
  // call, so what task i left in cache is usually still there for the next call's. A nested call
  // runs inline.
  void run_per_thread(int n, FunctionRef<void(int task)> fn);
  // True on a thread that is running a chunk of a parallel_for (where a nested one runs inline).
  static bool inside_parallel_loop();

 private:
  int threads_;
};

// The default team size: the CPUs this process may run on (allowed_cpus), so that `taskset` or a
// container's cpuset is honoured.
int hardware_threads();

// The CPUs this process may run on: its affinity mask, or where OpenMP binds threads
// (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY) the CPUs of OpenMP's places.
int allowed_cpus();

// For a process about to execv itself (apps/mpq/main.cpp): where OpenMP binds threads, libgomp
// pins the initial thread to the first place when the library loads, and execv keeps that
// thread's mask, so the new process would see that one place only (two threads on one core,
// slower than one thread). This sets the calling thread's mask back to the CPUs of all places.
// Nothing to do where OpenMP binds nothing.
void widen_affinity_to_openmp_places();

}  // namespace mpq::rt
