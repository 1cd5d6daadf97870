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
#include <optional>
#include <thread>

#include "engine/engine.h"
#include "numa/migrator.h"

namespace cxltier::service {

// Copy mode: a block copied from one tier pool to the other, published by
// the hand-off protocol (cxltier/lease.h). The mappings keep the pools and
// the client's segment mapped while the copy runs, whatever the client does.
struct CopyJob {
  std::shared_ptr<const numa::Mapping> src_pool, dst_pool, segment;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t bytes = 0;
  uint64_t* words = nullptr;  // the segment's location words
  uint32_t seg = 0;
  uint64_t expected = 0;  // the block's place now (the daemon's record)
  uint64_t next = 0;      // the place published when the copy is verified
  uint32_t src_pool_id = 0, src_index = 0;
  uint32_t dst_pool_id = 0, dst_index = 0;
};

// Runs one copy: BeginMove, copy and compare with the source (in chunks the
// cache holds), PublishMove. Done, or call "copy" failed with EBUSY (the
// client holds or took the write lease: the copy is dropped) or EIO (the copy
// differs from the source).
numa::MoveResult RunCopy(const CopyJob& job);

struct MoveJob {
  engine::Move move;
  numa::PageRange range;  // page mode
  std::optional<CopyJob> copy;
  int node = 0;
  uint64_t session = 0;  // the client's connection (server::Peer::session_id)
  uint32_t segment_slot = 0;
  uint32_t pool = 0;
  uint32_t block = 0;
  // Not a block's move but a released block's pages moved down
  // (ReleasedPages; `move.slot` is kNoSlot).
  bool released = false;

  uint64_t bytes() const { return copy ? copy->bytes : range.length; }
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
  // Drops every queued job `which` names, each reported as not done
  // (ECANCELED). A running job finishes.
  void CancelIf(const std::function<bool(const MoveJob&)>& which);
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
