// parallel_for for the CPU kernels: a thread pool that keeps working when another process takes a core.
//
// OpenMP's parallel_for (what at::parallel_for runs) gives each thread one static slice and ends every region with a
// barrier, so a region lasts as long as its slowest thread: when a neighbour process holds a core, one of our threads
// is descheduled for a scheduler time slice (milliseconds) inside nearly every region, and a forward of hundreds of
// regions slows by 10-50x. Here a region is cut into more chunks than threads; threads take chunks from one shared
// counter, and the caller returns as soon as every chunk is done — a thread that was not running never held a chunk,
// so nobody waits for it. An idle worker spins a few microseconds, then keeps polling with sched_yield() (any other
// thread that wants its core, torch's OpenMP worker or another process, runs first) for up to spin_us, then sleeps on
// a futex. A plain busy spin of that length would take the core from torch's OpenMP threads between two kernels
// (c=32 decode 20% slower); sleeping at once makes each region pay a futex wake-up (batch-1 decode 10% slower).
//
// Protocol (one job at a time, published by the calling thread):
//   claim_  = (epoch << 32) | next chunk index. The caller first stores the new epoch with index kClosed, then the
//             job fields, then the epoch with index 0. A worker loads claim_, reads the job fields, and takes a chunk
//             with a compare-exchange on the same value; success proves the job was still current when its fields
//             were read (a stale value fails: the epoch moved on before any field was rewritten).
//   done_   = chunks finished in the current job; the caller waits until it equals the chunk count.
//   wake_   = futex word bumped at each publish, for sleeping workers.
// Calls from inside a region, or while another thread runs one, run inline on the calling thread.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <immintrin.h>

namespace sgl_cpu {

class ThreadPool {
 public:
  static constexpr int64_t kPauseNs = 5000;  // an idle worker's busy spin before it starts yielding
  static constexpr int64_t kChunksPerThread = 4;
  static constexpr uint64_t kClosed = 0xffffffffu;  // claim_'s index while the caller writes a job: above any count
  using Body = std::function<void(int64_t, int64_t)>;

  static ThreadPool& instance() {
    static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive static destructors
    return *pool;
  }

  // Threads that run a region, the caller included (>= 1). Takes effect at the next region.
  void set_num_threads(int n) {
    std::lock_guard<std::mutex> g(owner_);
    n = std::max(1, n);
    while ((int)workers_.size() < n - 1) workers_.emplace_back([this, i = (int)workers_.size()] { worker_loop(i); });
    active_workers_.store(n - 1, std::memory_order_relaxed);
    num_threads_ = n;
  }
  int num_threads() const { return num_threads_; }

  // Microseconds an idle worker spins before it sleeps; and how long the caller spins on unfinished chunks before
  // yielding its core (to a worker that holds a chunk but was descheduled).
  void set_spin_us(int64_t us) { spin_ns_.store(std::max<int64_t>(0, us) * 1000, std::memory_order_relaxed); }
  int64_t spin_us() const { return spin_ns_.load(std::memory_order_relaxed) / 1000; }

  void run(int64_t begin, int64_t end, int64_t grain, const Body& body) {
    if (end <= begin) return;
    const int64_t n = end - begin;
    grain = std::max<int64_t>(1, grain);
    if (in_region_ || num_threads_ <= 1 || n <= grain) {  // nested, or nothing to share
      body(begin, end);
      return;
    }
    std::unique_lock<std::mutex> own(owner_, std::try_to_lock);
    if (!own.owns_lock()) {  // another thread is running a region: do this one alone rather than wait
      body(begin, end);
      return;
    }
    in_region_ = true;
    struct Leave {
      ~Leave() { in_region_ = false; }
    } leave;
    // Chunks: about kChunksPerThread per thread so that a slow thread's share is taken by the others, never below
    // the caller's grain (the smallest range worth its overhead).
    const int64_t want = (int64_t)num_threads_ * kChunksPerThread;
    const int64_t chunk = std::max(grain, (n + want - 1) / want);
    const int64_t chunks = (n + chunk - 1) / chunk;
    // Close the new epoch before rewriting the job: a worker still holding the previous job's last claim_ value
    // (every chunk taken) could otherwise read these new fields, find an index below the new chunk count and win its
    // compare-exchange before claim_ moves on — running a chunk twice and counting it into this job's done_, so the
    // caller would return while that worker still runs the body on its stack frame (seen as a crash in
    // decode_attention under load).
    const uint64_t epoch = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
    claim_.store((epoch << 32) | kClosed, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);  // pairs with the worker's acquire fence before its CAS
    body_.store(&body, std::memory_order_relaxed);
    begin_.store(begin, std::memory_order_relaxed);
    end_.store(end, std::memory_order_relaxed);
    chunk_.store(chunk, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    claim_.store(epoch << 32, std::memory_order_release);
    wake_.fetch_add(1);  // seq_cst with the sleepers_ load: pairs with the worker's sleepers_ add + wake_ re-check
    if (sleepers_.load() > 0) futex_wake(&wake_);
    work_chunks();
    wait_done(chunks);
    body_.store(nullptr, std::memory_order_relaxed);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  ThreadPool() {  // the cores this process may run on; the runtime sets the count it chose at startup
    cpu_set_t set;
    const int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    set_num_threads(n);
  }

  static void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
  }
  static void futex_wake(std::atomic<uint32_t>* word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Take chunks of the current job until none is left; returns whether any was taken.
  bool work_chunks() {
    bool any = false;
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      const Body* body = body_.load(std::memory_order_relaxed);
      const int64_t b = begin_.load(std::memory_order_relaxed), e = end_.load(std::memory_order_relaxed);
      const int64_t chunk = chunk_.load(std::memory_order_relaxed), chunks = chunks_.load(std::memory_order_relaxed);
      const int64_t idx = (int64_t)(c & kClosed);
      // a field written after the caller closed the epoch makes that close visible to the CAS below
      std::atomic_thread_fence(std::memory_order_acquire);
      if (body == nullptr || idx >= chunks) return any;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
      any = true;
      const int64_t lo = b + idx * chunk, hi = std::min(e, lo + chunk);
      try {
        (*body)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void wait_done(int64_t chunks) {
    const int64_t spin_ns = spin_ns_.load(std::memory_order_relaxed);
    const int64_t t0 = now_ns();
    while (done_.load(std::memory_order_acquire) < chunks) {
      if (now_ns() - t0 < spin_ns) {
        _mm_pause();
      } else {
        sched_yield();  // a worker holds a chunk but has no core: let it have ours
      }
    }
  }

  void worker_loop(int index) {
    in_region_ = true;  // a body that calls parallel_for runs it inline
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
      // idle: spin for a while on the wake word, then sleep on it
      const int64_t t0 = now_ns();
      uint32_t w;
      while ((w = wake_.load(std::memory_order_acquire)) == seen) {
        const int64_t idle_ns = now_ns() - t0;
        if (idle_ns >= spin_ns_.load(std::memory_order_relaxed)) {
          sleepers_.fetch_add(1);
          // re-check after registering, so a publish between the load and the wait is not missed (the futex itself
          // also returns at once when the word has moved on)
          if (wake_.load() == seen) futex_wait(&wake_, seen);
          sleepers_.fetch_sub(1);
        } else if (idle_ns < kPauseNs) {
          _mm_pause();
        } else {
          sched_yield();  // still ready within ~1 us, but any other thread that wants this core runs first
        }
      }
      seen = w;
      if (index < active_workers_.load(std::memory_order_relaxed)) work_chunks();
    }
  }

  std::mutex owner_;  // held by the thread running a region (and by set_num_threads)
  std::vector<std::thread> workers_;
  int num_threads_ = 1;
  std::atomic<int> active_workers_{0};
  std::atomic<int64_t> spin_ns_{2000 * 1000};
  std::atomic<const Body*> body_{nullptr};
  std::atomic<int64_t> begin_{0}, end_{0}, chunk_{1}, chunks_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;
  static inline thread_local bool in_region_ = false;  // this thread runs a region's body (caller or worker)
};

// Same contract as at::parallel_for: body(lo, hi) over disjoint ranges covering [begin, end), none shorter than
// grain except the last.
template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const ThreadPool::Body body = [&f](int64_t lo, int64_t hi) { f(lo, hi); };
  ThreadPool::instance().run(begin, end, grain, body);
}

}  // namespace sgl_cpu
