// A persistent fork-join pool for the summation engine.
//
// run(job) calls job(i) on every thread, the caller being thread 0 and the
// pool's num_threads-1 workers the rest, and returns when all have
// finished. The workers live as long as the pool, so a push pays a wake-up,
// never a thread start. Between jobs a worker spins for a short while
// before it sleeps on a condition variable: pushes arrive back to back
// while a round is busy, and waking a sleeping thread costs tens of
// microseconds (more on a virtual machine), a good part of summing a
// partition of a few hundred KiB.

#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BYTEPS_SPIN_PAUSE() _mm_pause()
#else
#define BYTEPS_SPIN_PAUSE() std::this_thread::yield()
#endif

namespace byteps {
namespace server {

class ThreadPool {
 public:
  // How long an idle worker (or the waiting caller) polls before sleeping.
  static constexpr std::chrono::microseconds kSpin{50};

  // num_threads counts the calling thread: num_threads - 1 workers start.
  explicit ThreadPool(size_t num_threads) : num_threads_(num_threads) {
    workers_.reserve(num_threads - 1);
    for (size_t i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return num_threads_; }

  // Runs job(i) for every i in [0, size()), job(0) on the calling thread,
  // and returns when all have finished. One run at a time (the engine's
  // mutex guarantees it). job must not throw.
  void run(const std::function<void(size_t)>& job) {
    if (workers_.empty()) {
      job(0);
      return;
    }
    job_ = &job;
    pending_.store(workers_.size(), std::memory_order_relaxed);
    {
      // Under the mutex, so that a worker between its predicate check and
      // its wait cannot miss the new generation.
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    start_cv_.notify_all();
    job(0);
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    job_ = nullptr;
  }

 private:
  template <typename Ready>
  static bool spin_until(const Ready& ready) {
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (ready()) return true;
        BYTEPS_SPIN_PAUSE();
      }
      if (std::chrono::steady_clock::now() >= deadline) return ready();
    }
  }

  void work(size_t index) {
    uint64_t seen = 0;
    for (;;) {
      auto started = [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(started)) {
        std::unique_lock<std::mutex> lock(mu_);
        start_cv_.wait(lock, started);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      (*job_)(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
    }
  }

  const size_t num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t)>* job_ = nullptr;  // published by generation_
  std::atomic<uint64_t> generation_{0};
  std::atomic<size_t> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace server
}  // namespace byteps
