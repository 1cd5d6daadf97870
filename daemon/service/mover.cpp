#include "service/mover.h"

#include <cerrno>
#include <vector>

namespace cxltier::service {

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
  std::vector<MoveJob> dropped;
  {
    std::lock_guard lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->move.slot == slot && it->move.generation == generation) {
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
    numa::MoveResult r = migrator_->Move(job.range, job.node);
    next = std::max(next, start) +
           std::chrono::nanoseconds(static_cast<int64_t>(1e9 * job.range.length / rate));
    on_done_(MoveDone{std::move(job), r});
    std::lock_guard lock(mu_);
    --running_;
  }
}

}  // namespace cxltier::service
