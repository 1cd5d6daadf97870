// The mover: carries out planned moves on its own thread, at most `rate`
// bytes per second, and reports each verified result back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "numa/migrator.h"

namespace cxltier::service {

struct MoveJob {
  engine::Move move;
  numa::PageRange range;
  int node = 0;
  uint64_t session = 0;  // the client's connection (server::Peer::session_id)
  uint32_t segment_slot = 0;
  uint32_t pool = 0;
  uint32_t block = 0;
};

struct MoveDone {
  MoveJob job;
  numa::MoveResult result;
};

class Mover {
 public:
  // `on_done` runs on the mover thread; it must hand the result to the owner's
  // thread (the daemon posts it to its io_context).
  Mover(std::shared_ptr<numa::Migrator> migrator, uint64_t rate_bytes_per_s,
        std::function<void(MoveDone)> on_done);
  ~Mover();

  void Submit(MoveJob job);
  // Drops a queued job for this engine slot and generation (the block was
  // released); it is reported as not done (ECANCELED). A running job finishes.
  void Cancel(engine::Slot slot, uint32_t generation);
  // Jobs queued or running.
  size_t pending() const;
  void set_rate(uint64_t bytes_per_s);
  // Finishes the job in progress, drops the queue (each dropped job is reported
  // as not done), and joins the thread.
  void Stop();

 private:
  void Run();

  std::shared_ptr<numa::Migrator> migrator_;
  std::function<void(MoveDone)> on_done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<MoveJob> queue_;  // GUARDED_BY(mu_)
  size_t running_ = 0;         // GUARDED_BY(mu_)
  uint64_t rate_;              // GUARDED_BY(mu_)
  bool stop_ = false;          // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace cxltier::service
