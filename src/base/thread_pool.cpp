#include "tessera/base/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace tessera {
namespace {

thread_local bool t_inside_pool = false;
thread_local int t_serial_depth = 0;  // live SerialKernelsScopes on this thread

// The CPUs this process may run on (its affinity mask: taskset, a container's cpuset).
int cpus_available() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

// The processes of this job on this host, which share its CPUs: tessera launch's
// TESSERA_LOCAL_WORLD_SIZE, else OpenMPI's or MPICH's count, else 1.
int processes_on_host() {
  if (flags::env("TESSERA_LOCAL_WORLD_SIZE"))
    return static_cast<int>(flags::env_integer("TESSERA_LOCAL_WORLD_SIZE", 1, 1, 1 << 20, "a process count"));
  return static_cast<int>(
      flags::first_env_integer({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1, 1 << 20).value_or(1));
}

// How long a thread of a region polls before it sleeps (TESSERA_POOL_SPIN_US), read when
// the pool starts and when it is resized.
int spin_microseconds() {
  return static_cast<int>(flags::env_integer("TESSERA_POOL_SPIN_US", 50, 0, 1000000, "a time in microseconds"));
}

class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    start(n, processes_on_host());
    // fork() copies only the calling thread: a child (Python's multiprocessing, a test)
    // would wait forever for workers that do not exist in it. The child's handler drops
    // them and the child starts its own on its first parallel region.
    static const int registered = pthread_atfork(nullptr, nullptr, [] {
      if (g_pool != nullptr) g_pool->forget_workers_after_fork();
    });
    (void)registered;
    g_pool = this;
  }
  ~ThreadPool() {
    stop();
    g_pool = nullptr;
  }

  int size() const { return threads_; }
  int poll_microseconds() const { return oversubscribed_ || threads_ == 1 ? 0 : spin_us_; }

  // (The spin setting and the host's process count are read again, so changed variables
  // take effect; a bad one leaves the pool as it was.)
  void resize(int n) {
    const int spin_us = spin_microseconds();
    const int processes = processes_on_host();
    stop();
    spin_us_ = spin_us;
    start(n, processes);
  }

  void run(int64_t chunks, FunctionRef<void(int64_t)> body) {
    std::unique_lock<std::mutex> lock(run_mutex_);  // one parallel region at a time
    if (workers_lost_in_fork_) start(threads_, processes_);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      body_ = &body;
      total_ = chunks;
      next_.store(0);
      done_ = 0;
      active_.store(static_cast<int>(workers_.size()));
      generation_.fetch_add(1, std::memory_order_release);  // publishes the fields above to spinning workers
    }
    wake_.notify_all();
    t_inside_pool = true;
    int64_t mine = drain();
    t_inside_pool = false;
    const bool joined = spin_until([&] { return active_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> guard(mutex_);
    done_ += mine;
    if (!joined) finished_.wait(guard, [&] { return active_.load() == 0; });
    body_ = nullptr;
  }

 private:
  // Polls `ready` for up to spin_us_ microseconds (the region's other threads usually
  // arrive within a few): true when it became true. A futex sleep and wake costs tens of
  // microseconds on a virtual machine, and a training step runs hundreds of regions.
  template <typename Ready>
  bool spin_until(Ready ready) const {
    if (ready()) return true;
    if (spin_us_ <= 0 || oversubscribed_) return false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    for (;;) {
      for (int i = 0; i < 32; ++i) {
        cpu_relax();
        if (ready()) return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  int64_t drain() {
    int64_t count = 0;
    for (int64_t c = next_.fetch_add(1); c < total_; c = next_.fetch_add(1)) {
      (*body_)(c);
      ++count;
    }
    return count;
  }

  // `seen`: the generation when the worker started. A worker started by a resize must
  // not take an earlier region's generation for a new one: it would drain nothing and
  // decrement active_ for a region it never joined, so run() could return while the
  // worker still ran chunks of the next region, or wait forever (active_ below 0).
  void worker_loop(uint64_t seen) {
    t_inside_pool = true;
    for (;;) {
      auto woken = [&] {
        return stopping_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(woken)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, woken);
      }
      if (stopping_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      int64_t mine = drain();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_ += mine;
        active_.fetch_sub(1, std::memory_order_release);
      }
      finished_.notify_all();
    }
  }

  void start(int n, int processes) {
    stopping_.store(false);
    workers_lost_in_fork_ = false;
    threads_ = n;
    processes_ = processes;
    oversubscribed_ = static_cast<int64_t>(n) * processes > cpus_available();
    uint64_t current = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current = generation_.load();
    }
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, current] { worker_loop(current); });
  }

  // In a fork's child (the handler runs before fork() returns there): the std::thread
  // objects name threads of the parent, which can neither be joined nor detached here, so
  // they are leaked; the locks and condition variables may have been held by those
  // threads at the fork, so they are made anew.
  void forget_workers_after_fork() {
    if (workers_.empty()) return;
    new std::vector<std::thread>(std::move(workers_));  // never destroyed: ~thread would terminate
    workers_.clear();
    new (&run_mutex_) std::mutex;
    new (&mutex_) std::mutex;
    new (&wake_) std::condition_variable;
    new (&finished_) std::condition_variable;
    body_ = nullptr;
    active_.store(0);
    stopping_.store(false);
    workers_lost_in_fork_ = true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_.store(true);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const FunctionRef<void(int64_t)>* body_ = nullptr;
  std::atomic<int64_t> next_{0};
  int64_t total_ = 0;
  int64_t done_ = 0;
  std::atomic<int> active_{0};           // workers still in the region
  std::atomic<uint64_t> generation_{0};  // regions started
  std::atomic<bool> stopping_{false};
  int spin_us_ = spin_microseconds();
  // More threads (over this host's processes of the job) than the CPUs this process may
  // run on: a polling thread would hold a CPU that a thread of the same region is waiting
  // for, so nobody spins.
  bool oversubscribed_ = false;
  int processes_ = 1;  // this host's processes of the job (processes_on_host)
  int threads_ = 1;    // the caller included
  bool workers_lost_in_fork_ = false;

  static inline ThreadPool* g_pool = nullptr;
};

int initial_threads() {
  if (const char* env = flags::env("TESSERA_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n < 1) fail<ValueError>("TESSERA_NUM_THREADS={} is not a positive integer", env);
    return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool instance(initial_threads());
  return instance;
}

}  // namespace

int num_threads() { return pool().size(); }

int pool_poll_microseconds() { return pool().poll_microseconds(); }

void set_num_threads(int n) {
  if (n < 1) fail<ValueError>("set_num_threads: {} is not a positive thread count", n);
  if (n != pool().size()) pool().resize(n);
}

SerialKernelsScope::SerialKernelsScope() { ++t_serial_depth; }
SerialKernelsScope::~SerialKernelsScope() { --t_serial_depth; }

int64_t default_grain(int64_t n, int64_t min_grain) {
  // Independent of the thread count on purpose (see the header): 8 chunks at most per
  // 64k-element block keeps scheduling overhead small and results reproducible.
  return std::max<int64_t>(min_grain, (n + 63) / 64);
}

void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t chunks = num_chunks(n, grain);
  if (chunks == 1 || t_inside_pool || t_serial_depth > 0 || pool().size() == 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  // An exception in a worker must reach the caller (a bad index inside a kernel is a
  // user error, not a crash): keep the one from the lowest chunk, rethrow it here.
  std::mutex error_mutex;
  std::exception_ptr error;
  int64_t error_chunk = chunks;
  pool().run(chunks, [&](int64_t c) {
    try {
      fn(c * grain, std::min(n, (c + 1) * grain));
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (c < error_chunk) {
        error_chunk = c;
        error = std::current_exception();
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace tessera
