// Ghost checkpoints: the ghost store (and the live blocks' states) written to
// the state directory so a restart keeps them, each state with its owner (the
// uid whose ghost share it counts against) and the daemon's clock (states'
// touch times are its ticks, so a restart continues it). Written to a temporary file,
// fsynced, renamed; checked with XXH64 when read back. A CheckpointWriter does
// the writing on a thread of its own, so the I/O thread only copies the states.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/status.h"

namespace cxltier::service {

// The owner of a state whose owner is not known: every state of a version-1
// checkpoint (written before ghosts had owners). It is (uid_t)-1, never a
// real uid, so those states share one owner's ghost share.
inline constexpr uint32_t kUnknownOwner = 0xffffffffu;

// The daemon's clock as a checkpoint keeps it. Every state's touch_time is a
// tick of this clock; a daemon that loads the file starts its clock at
// resume_tick, so that every restored time is in the past.
struct CheckpointClock {
  uint64_t tick = 0;         // the daemon's tick when the states were copied
  uint64_t resume_tick = 0;  // where the next daemon's clock starts (>= tick)
};

// Block states with the owner of each, as two flat arrays (a million states
// copy as two memcpys on the I/O thread), and the clock they were taken at.
struct GhostSnapshot {
  std::vector<BlockState> states;
  std::vector<uint32_t> owners;  // owners[i] owns states[i]; same length
  CheckpointClock clock;
};

// Writes a version-4 checkpoint (version 3 with `keyed` false: the keys are
// not made with a key secret, as a daemon from before the secret wrote them;
// for tests of an upgrade). `owners` must be empty (every state then gets
// kUnknownOwner) or as long as `ghosts`. A failure is kInternal.
Status SaveGhosts(const std::string& path, const std::vector<BlockState>& ghosts,
                  const std::vector<uint32_t>& owners = {}, CheckpointClock clock = {},
                  bool keyed = true);
inline Status SaveGhosts(const std::string& path, const GhostSnapshot& snapshot) {
  return SaveGhosts(path, snapshot.states, snapshot.owners, snapshot.clock);
}

struct LoadedGhosts {
  std::vector<BlockState> ghosts;
  std::vector<uint32_t> owners;  // same length as ghosts; kUnknownOwner from a version-1 file
  // Version 3: the file's clock. Versions 1 and 2 did not keep one: both
  // ticks are then the latest touch_time in the file. Either way resume_tick
  // is at least every state's touch_time, so no restored state is ahead of it.
  CheckpointClock clock;
  uint32_t version = 0;  // of the file read (1 to 4)
  // Whether the keys are made with the key secret (version 4); before, the
  // client's key XORed with a function of the owner's uid.
  bool keyed() const { return version >= 4; }
  bool found = false;  // a file was there
  Status status;       // not ok: it was there but corrupt or unreadable (then set aside)
};

// Reads a checkpoint of version 1 (states only), 2 (states and owners), 3
// (the clock, states and owners) or 4 (3, keyed). A corrupt or truncated file is renamed to
// PATH.corrupt and reported, never loaded.
LoadedGhosts LoadGhosts(const std::string& path);

// Writes checkpoints on its own thread. At most one snapshot waits while one
// is written: a newer snapshot replaces a waiting one (it holds everything
// the older one did that still matters), so memory stays bounded at two
// snapshots however slow the disk. Thread-safe.
class CheckpointWriter {
 public:
  // Writes one snapshot. SaveGhosts by default; tests inject a slow or failing one.
  using Sink = std::function<Status(const std::string& path, const GhostSnapshot&)>;
  // Called on the writer thread after each write with its outcome.
  using Done = std::function<void(const Status& written)>;

  explicit CheckpointWriter(Done done = {}, Sink sink = {});
  ~CheckpointWriter();  // Stop()
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Hands `snapshot` to the writer thread and returns at once: never waits for
  // a write. Returns false if it replaced a snapshot that was still waiting
  // (or the writer is stopped: then nothing is written).
  bool Submit(std::string path, GhostSnapshot snapshot);

  // Waits for the write in flight, drops a waiting snapshot and joins the
  // thread; Submit writes nothing afterwards. The caller then writes its final
  // snapshot with SaveGhosts itself, and no write of this writer can land after it.
  void Stop();

  bool stopped() const;       // Stop() was called
  uint64_t written() const;   // writes done (successful or not)
  uint64_t replaced() const;  // waiting snapshots replaced by newer ones
  bool busy() const;          // a write is in flight or a snapshot waits

 private:
  struct Job {
    std::string path;
    GhostSnapshot snapshot;
  };
  void Run();

  Done done_;
  Sink sink_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> pending_;  // GUARDED_BY(mu_)
  bool writing_ = false;        // GUARDED_BY(mu_)
  bool stop_ = false;           // GUARDED_BY(mu_)
  uint64_t written_ = 0;        // GUARDED_BY(mu_)
  uint64_t replaced_ = 0;       // GUARDED_BY(mu_)
  std::thread thread_;          // last: starts once the rest is built
};

}  // namespace cxltier::service
