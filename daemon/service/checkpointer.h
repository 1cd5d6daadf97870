// The daemon's ghost checkpoint in its state directory: read once at start,
// written every checkpoint interval by a CheckpointWriter thread (the I/O
// thread only copies the states) and a last time, inline, at stop. What
// goes into a snapshot (ghosts and live states) is the daemon's to collect.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "service/checkpoint.h"
#include "service/client_table.h"

namespace cxltier::service {

// The tick a restart resumes at when the periodic checkpoint taken at `tick`
// is the last one on disk (a crash: no final checkpoint was written).
uint64_t ResumeTickAfterCrash(uint64_t checkpoint_interval_s, uint32_t tick_ms, uint64_t tick);

// What a checkpoint keeps: the engine's ghosts, then, with `live`, the state
// of every block a client of `live` holds, each state with its owner.
GhostSnapshot CollectStates(const engine::Engine& engine, const ClientTable* live);

class Checkpointer {
 public:
  // `post` runs a function on the I/O thread: the writer's results come back
  // through it. Save and SaveFinal are called on that thread too.
  Checkpointer(std::string state_dir, std::function<void(std::function<void()>)> post);
  ~Checkpointer();

  const std::string& path() const { return path_; }
  // Makes the state directory the daemon's alone (mode 0700) when it owns
  // it: the state is private (the ghosts' keys and scores, the key secret),
  // and a user who can open the directory could hold its lock. When another
  // uid owns a directory others may open, a warning.
  void KeepPrivate() const;
  // Takes the state directory for this process alone (an exclusive flock on
  // the directory, held until this is destroyed; the kernel drops it when
  // the process dies, however). On a filesystem without flock, a warning. A
  // second daemon on the same directory would write the same checkpoint's
  // temporary file (one renamed it while the other still wrote it, and the
  // next start set the checkpoint aside as corrupt: every ghost lost): it is
  // refused at its start instead.
  Status Lock();
  // Reads the checkpoint (a corrupt one is set aside) and logs what it found.
  // The keys of a file from before the key secret (version 3 or older) are
  // made anew with `keys` from their owners' uids.
  LoadedGhosts Load(const EngineKeys& keys) const;
  // Starts the writer thread; without it (it cannot start) Save writes inline.
  void StartWriter();
  // A periodic checkpoint: handed to the writer thread, a snapshot still
  // waiting for the disk replaced.
  void Save(GhostSnapshot snapshot);
  // The last checkpoint: waits for the writer's write in flight, so none
  // lands after this one, and writes `snapshot` here.
  void SaveFinal(const GhostSnapshot& snapshot);

 private:
  void Written(const Status& written);  // logs an error once, until it clears

  std::string path_;
  std::function<void(std::function<void()>)> post_;
  std::unique_ptr<CheckpointWriter> writer_;  // null: checkpoints written inline
  std::string last_error_;
  int lock_fd_ = -1;
};

}  // namespace cxltier::service
