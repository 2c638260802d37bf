#include "runtime/thread_pool.h"

#include <algorithm>
#include <exception>

namespace mpq::rt {

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = hardware_threads();
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    ++active_;
    while (next_ < job_n_) {
      int64_t begin = next_;
      int64_t end = std::min(job_n_, begin + chunk_);
      next_ = end;
      lock.unlock();
      (*job)(begin, end);
      lock.lock();
    }
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = static_cast<int64_t>(size()) * 4;
  int64_t chunk = std::max(grain, (n + max_chunks - 1) / max_chunks);
  // Nested calls (a kernel inside a parallel region) and small jobs run inline.
  if (workers_.empty() || n <= chunk || in_parallel_) {
    fn(0, n);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mu;
  std::function<void(int64_t, int64_t)> guarded = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
  };
  std::unique_lock<std::mutex> lock(mu_);
  in_parallel_ = true;
  job_ = &guarded;
  job_n_ = n;
  chunk_ = chunk;
  next_ = 0;
  ++generation_;
  work_cv_.notify_all();
  ++active_;
  while (next_ < job_n_) {
    int64_t begin = next_;
    int64_t end = std::min(job_n_, begin + chunk_);
    next_ = end;
    lock.unlock();
    guarded(begin, end);
    lock.lock();
  }
  --active_;
  done_cv_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
  in_parallel_ = false;
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace mpq::rt
