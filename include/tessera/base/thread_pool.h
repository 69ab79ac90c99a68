// One thread pool for the whole process. Between parallel regions a worker polls for
// the next one for TESSERA_POOL_SPIN_US microseconds (default 50), then sleeps on a
// condition variable; the caller polls for the region's end the same way. A training
// step runs hundreds of short regions, and a futex sleep and wake costs tens of
// microseconds on a virtual machine (6-13% of a small step on 2 cores); 0 sleeps at once.
// Nobody polls where the job's threads on this host outnumber the CPUs
// (pool_poll_microseconds below).
//
// Work is split into chunks whose boundaries depend only on the problem size and
// the grain, never on the number of threads: a kernel that combines per-chunk
// partial results in chunk order is bitwise identical for any thread count.
//
// A child of fork() (Python's multiprocessing, for one) keeps the thread count and starts
// its own workers on its first parallel region; the parent's are not in it.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace tessera {

// A non-owning reference to a callable (like C++26 std::function_ref): passing a
// lambda allocates nothing, which keeps compiled programs allocation-free per run.
template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit on purpose, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

// Number of threads the pool runs (the caller included). Default: TESSERA_NUM_THREADS,
// else the hardware concurrency.
int num_threads();
// How long the pool's threads poll between regions: TESSERA_POOL_SPIN_US, or 0 with one
// thread, or when the threads of this host's processes of the job
// (TESSERA_LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS, else 1) times
// num_threads() exceed the CPUs of this process's affinity mask.
int pool_poll_microseconds();

// Resizes the pool (n >= 1), reading TESSERA_POOL_SPIN_US again (ValueError, and the
// pool unchanged, if it is not 0..1000000). Not to be called while a parallel_for is running.
void set_num_threads(int n);

// Calls fn(begin, end) over [0, n) in chunks of `grain` elements (the last may be
// shorter). Chunk c covers [c*grain, min(n, (c+1)*grain)). Runs inline when there is
// one chunk or one thread; nested calls run inline.
void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

// Number of chunks parallel_for(n, grain, ...) will make.
inline int64_t num_chunks(int64_t n, int64_t grain) { return n <= 0 ? 0 : (n + grain - 1) / grain; }

// A grain that gives about `per_thread` chunks per thread for n items, at least `min_grain`.
int64_t default_grain(int64_t n, int64_t min_grain = 1024);

// While alive on a thread, parallel_for called on that thread runs inline (chunk
// order unchanged, so results stay bitwise the same). The in-process SPMD runtime
// puts one around each virtual device's thread: N device threads sharing one pool
// would serialize on it, and the devices already keep the cores busy.
class SerialKernelsScope {
 public:
  SerialKernelsScope();
  ~SerialKernelsScope();
  SerialKernelsScope(const SerialKernelsScope&) = delete;
  SerialKernelsScope& operator=(const SerialKernelsScope&) = delete;
};

}  // namespace tessera
