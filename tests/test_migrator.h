// The tests' one migrator: a numa::Migrator that records every call and can
// inject faults, in front of the real Linux migrator (real move_pages) or of
// nothing (every move reported done and every page on one node, without a
// syscall). Thread-safe: the daemon's mover calls it from its own thread.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "numa/migrator.h"

namespace cxltier::test {

class TestMigrator : public numa::Migrator {
 public:
  struct Options {
    // Moves go to the Linux migrator, and Where asks the kernel. Otherwise
    // every move is reported done and every page is on `where_node`.
    bool real = false;
    int where_node = 0;
    // The first Move waits inside until Release(): the test then knows that
    // every later job is still queued, however slow the machine is.
    bool hold_first = false;
    // While failing (set_failing), every Move gets the next of EBUSY, ENOMEM,
    // EFAULT and a partial move (the first half moved, the rest not) in turn.
    bool failing = false;
    // Each Move sleeps this long first (a slow migrator).
    std::chrono::milliseconds delay{0};
  };

  TestMigrator() : TestMigrator(Options{}) {}
  explicit TestMigrator(Options o) : o_(o), holding_(o.hold_first), failing_(o.failing) {
    if (o_.real) real_ = numa::MakeLinuxMigrator();
  }

  numa::MoveResult Move(const numa::PageRange& r, int node) override {
    if (o_.delay.count() > 0) std::this_thread::sleep_for(o_.delay);
    Fault f = Fault::kNone;
    {
      std::unique_lock lock(mu);
      ++calls_total_;
      ++calls_[r.address];
      cv_.notify_all();
      cv_.wait(lock, [this] { return !holding_; });
      if (failing_) {
        static constexpr Fault kCycle[] = {Fault::kBusy, Fault::kNoMem, Fault::kFault,
                                           Fault::kPartial};
        f = kCycle[injected_++ % 4];
      }
    }
    const size_t pages = r.length / 4096;
    numa::MoveResult res;
    switch (f) {
      case Fault::kNone:
        res = Pass(r, node);
        break;
      case Fault::kBusy:
        res.pages = pages;
        res.busy = pages;
        break;
      case Fault::kNoMem:
        res.pages = pages;
        res.call_errno = ENOMEM;
        break;
      case Fault::kFault:
        res.pages = pages;
        res.call_errno = EFAULT;
        break;
      case Fault::kPartial: {      // the first half moved, the rest did not
        numa::PageRange half = r;  // keeps the mapping (or process) the range holds
        half.length = r.length / 2;
        res = Pass(half, node);
        res.pages = pages;
        res.elsewhere = pages - res.verified - res.absent;
        break;
      }
    }
    std::lock_guard lock(mu);
    moved.push_back({r.address, node});
    if (res.done()) ++done_[r.address];
    return res;
  }

  std::vector<int> Where(const numa::PageRange& r) override {
    {
      std::lock_guard lock(mu);
      ++asked_;
    }
    if (real_) return real_->Where(r);
    return std::vector<int>(r.length / 4096, where_node_.load());
  }

  // A pool block's policy: the real migrator's, when in front of one.
  Status Steer(const numa::PageRange& r, const std::vector<int>& nodes) override {
    return real_ ? real_->Steer(r, nodes) : Status::Ok();
  }

  // Waits (up to 60 s) until Move() was entered `n` times in all.
  bool WaitForCalls(int n) {
    std::unique_lock lock(mu);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return calls_total_ >= n; });
  }
  // Lets the held first Move (and every later one) go on.
  void Release() {
    std::lock_guard lock(mu);
    holding_ = false;
    cv_.notify_all();
  }
  // Where every page is from now on (without `real`).
  void set_where_node(int node) { where_node_ = node; }
  void set_failing(bool on) {
    std::lock_guard lock(mu);
    failing_ = on;
  }
  // Faults injected so far.
  size_t injected() {
    std::lock_guard lock(mu);
    return injected_;
  }
  // Move calls, and moves reported done, by range address.
  std::map<uintptr_t, int> calls() {
    std::lock_guard lock(mu);
    return calls_;
  }
  std::map<uintptr_t, int> done() {
    std::lock_guard lock(mu);
    return done_;
  }
  // Where calls so far.
  int asked() {
    std::lock_guard lock(mu);
    return asked_;
  }

  // Every Move's (range address, node), in order; read under `mu`.
  std::mutex mu;
  std::vector<std::pair<uintptr_t, int>> moved;

 private:
  enum class Fault { kNone, kBusy, kNoMem, kFault, kPartial };

  numa::MoveResult Pass(const numa::PageRange& r, int node) {
    if (real_) return real_->Move(r, node);
    numa::MoveResult res;
    res.pages = res.verified = r.length / 4096;
    return res;
  }

  const Options o_;
  std::unique_ptr<numa::Migrator> real_;
  std::condition_variable cv_;
  bool holding_;
  bool failing_;
  std::atomic<int> where_node_{o_.where_node};
  size_t injected_ = 0;
  int calls_total_ = 0;
  int asked_ = 0;
  std::map<uintptr_t, int> calls_;
  std::map<uintptr_t, int> done_;
};

}  // namespace cxltier::test
