#include "service/mover.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cxltier/lease.h"

namespace cxltier::service {

numa::MoveResult RunCopy(const CopyJob& j) {
  numa::MoveResult r;
  r.pages = (j.bytes + 4095) / 4096;
  r.call = "copy";
  if (!BeginMove(j.words, j.seg, j.expected)) {
    r.call_errno = EBUSY;
    return r;
  }
  // Each chunk is compared with its source right after it is copied, while
  // the L1 cache still holds both sides (16 KiB a side; 8 and 16 KiB were the
  // fastest of 4 KiB to 128 KiB on the bench machine). A byte-for-byte compare
  // is a stronger check than a hash of each side, and costs far less: XXH3
  // runs at about 39 GiB/s a core, so hashing both sides adds some 40% to a
  // memcpy at 8 GiB/s (docs/performance.md, figure 7).
  constexpr uint64_t kChunk = 16 << 10;
  bool same = true;
  for (uint64_t off = 0; off < j.bytes && same; off += kChunk) {
    const uint64_t n = std::min(kChunk, j.bytes - off);
    std::memcpy(j.dst + off, j.src + off, n);
    same = std::memcmp(j.dst + off, j.src + off, n) == 0;
  }
  if (!same) {
    // A writer that came during the copy (it cleared M) explains a difference.
    const uint64_t now = std::atomic_ref<uint64_t>(j.words[j.seg]).load(std::memory_order_acquire);
    AbortMove(j.words, j.seg);
    r.call_errno = now == (j.expected | kLocMoving) ? EIO : EBUSY;
    return r;
  }
  if (!PublishMove(j.words, j.seg, j.expected, j.next)) {
    AbortMove(j.words, j.seg);
    r.call_errno = EBUSY;
    return r;
  }
  r.verified = r.pages;
  r.call_errno = 0;
  return r;
}

Mover::Mover(std::shared_ptr<numa::Migrator> migrator, uint64_t rate_bytes_per_s,
             std::function<void(MoveDone)> on_done)
    : migrator_(std::move(migrator)), on_done_(std::move(on_done)), rate_(rate_bytes_per_s) {
  thread_ = std::thread([this] { Run(); });
}

Mover::~Mover() { Stop(); }

void Mover::Submit(MoveJob job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Mover::Cancel(engine::Slot slot, uint32_t generation) {
  CancelIf(
      [&](const MoveJob& j) { return j.move.slot == slot && j.move.generation == generation; });
}

void Mover::CancelIf(const std::function<bool(const MoveJob&)>& which) {
  std::vector<MoveJob> dropped;
  {
    std::lock_guard lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (which(*it)) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (MoveJob& j : dropped) {
    numa::MoveResult r;
    r.call_errno = ECANCELED;
    on_done_(MoveDone{std::move(j), r});
  }
}

size_t Mover::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + running_;
}

void Mover::set_rate(uint64_t bytes_per_s) {
  std::lock_guard lock(mu_);
  rate_ = bytes_per_s ? bytes_per_s : 1;
}

void Mover::Stop() {
  std::deque<MoveJob> dropped;
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (MoveJob& j : dropped) {
    numa::MoveResult r;
    r.call_errno = ECANCELED;
    on_done_(MoveDone{std::move(j), r});
  }
}

void Mover::Run() {
  using clock = std::chrono::steady_clock;
  clock::time_point next = clock::now();
  for (;;) {
    MoveJob job;
    uint64_t rate;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      // Token bucket: a job may start once the bytes before it have "drained".
      if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
      // The lock was released while waiting: Cancel() may have emptied the queue.
      if (queue_.empty()) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      rate = rate_;
    }
    const auto start = clock::now();
    numa::MoveResult r = job.copy ? RunCopy(*job.copy) : migrator_->Move(job.range, job.node);
    next = std::max(next, start) +
           std::chrono::nanoseconds(static_cast<int64_t>(1e9 * job.bytes() / rate));
    on_done_(MoveDone{std::move(job), r});
    std::lock_guard lock(mu_);
    --running_;
  }
}

}  // namespace cxltier::service
