#include "service/checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <utility>

namespace cxltier::service {

// After a SIGKILL the clock had run on past `tick`, up to the tick the next
// periodic checkpoint was due at (the crash came before that one was on
// disk), and clients saw those ticks in daemon_ticks and in their slots.
// Resuming at `tick` would repeat them, an old block's time could then be
// ahead of now, and restored blocks would decay less than they really did;
// resuming where the next checkpoint was due keeps the clock monotonic and
// counts at most one interval of decay that did not happen, the same for
// every restored block, so their order among themselves holds. (A write
// still in flight at the crash, or one that failed, leaves the file older;
// its states are still in the past, only the clock repeats some ticks.)
uint64_t ResumeTickAfterCrash(uint64_t checkpoint_interval_s, uint32_t tick_ms, uint64_t tick) {
  if (checkpoint_interval_s == 0 || tick_ms == 0) return tick;
  const uint64_t interval_ms = checkpoint_interval_s * 1000ull;
  return tick + (interval_ms + tick_ms - 1) / tick_ms;
}

GhostSnapshot CollectStates(const engine::Engine& engine, const ClientTable* live) {
  GhostSnapshot out;
  // One allocation, one copy, for the ghosts and the live states alike.
  const size_t n = engine.ghosts().size() + (live ? engine.live_blocks() : 0);
  out.states.reserve(n);
  out.owners.reserve(n);
  engine.ghosts().ForEach([&out](const BlockState& g, uint32_t owner) {
    out.states.push_back(g);
    out.owners.push_back(owner);
  });
  if (!live) return out;
  for (const auto& [session, c] : live->all()) {
    for (const SegSlot& s : c.slots) {
      if (!s.live) continue;
      out.states.push_back(engine.state(s.engine_slot));
      out.owners.push_back(engine.owner(s.engine_slot));
    }
  }
  return out;
}

Checkpointer::Checkpointer(std::string state_dir, std::function<void(std::function<void()>)> post)
    : path_((std::filesystem::path(state_dir) / "ghosts.bin").string()), post_(std::move(post)) {}

Checkpointer::~Checkpointer() {
  if (lock_fd_ >= 0) close(lock_fd_);
}

Status Checkpointer::Lock() {
  if (lock_fd_ >= 0) return Status::Ok();
  // The directory itself: no file to own, so a lock left by a run as
  // another user (root's, say) cannot keep this one from starting.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return Status::Fail(wire::ErrorCode::kInternal, dir + ": " + std::strerror(errno));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      // A filesystem without locks: run, unguarded, rather than not at all.
      spdlog::warn("{}: flock: {}; a second daemon on this state directory would not be stopped",
                   dir, std::strerror(err));
      lock_fd_ = fd;
      return Status::Ok();
    }
    close(fd);
    return Status::Fail(wire::ErrorCode::kInternal,
                        "another cxltierd uses the state directory " + dir +
                            " (it holds a lock on it); stop it, or give this one its own "
                            "[daemon] state_dir");
  }
  lock_fd_ = fd;
  return Status::Ok();
}

void Checkpointer::KeepPrivate() const {
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  if (st.st_uid != geteuid()) {
    spdlog::warn(
        "state dir {} belongs to uid {} and others may open it: one of them could hold "
        "its lock and keep this daemon from starting",
        dir, st.st_uid);
  } else if (chmod(dir.c_str(), st.st_mode & 0700) == 0) {
    spdlog::info("state dir {}: mode {:o} -> {:o}", dir, st.st_mode & 0777, st.st_mode & 0700);
  }
}

LoadedGhosts Checkpointer::Load(const EngineKeys& keys) const {
  LoadedGhosts loaded = LoadGhosts(path_);
  if (loaded.found && !loaded.keyed()) {
    // Written by a daemon from before the key secret (version 3 or older):
    // its keys are made the old way, and made anew here from the owners.
    size_t converted = 0;
    for (size_t i = 0; i < loaded.ghosts.size() && i < loaded.owners.size(); ++i) {
      if (loaded.owners[i] == kUnknownOwner) continue;
      loaded.ghosts[i].key = keys.FromUnkeyed(loaded.ghosts[i].key, loaded.owners[i]);
      ++converted;
    }
    if (converted) {
      spdlog::info(
          "checkpoint of version {}: the keys of {} of its {} ghosts made with the key "
          "secret (ghosts of unknown owners are not found again)",
          loaded.version, converted, loaded.ghosts.size());
    }
  }
  if (!loaded.status.ok()) spdlog::error("ghost checkpoint: {}", loaded.status.message);
  const bool good = loaded.found && loaded.status.ok();
  if (good) spdlog::info("loaded {} ghosts from {}", loaded.ghosts.size(), path_);
  if (loaded.version == 1 && !loaded.ghosts.empty()) {
    spdlog::info("checkpoint of version 1: its {} ghosts share one owner's ghost share",
                 loaded.ghosts.size());
  }
  if (good) {
    spdlog::info("clock resumes at tick {} (checkpoint taken at tick {})", loaded.clock.resume_tick,
                 loaded.clock.tick);
  }
  return loaded;
}

void Checkpointer::StartWriter() {
  // A million states are 64 MiB to write and fsync, which must not stall the
  // clients: periodic checkpoints are written on a thread of their own.
  try {
    writer_ = std::make_unique<CheckpointWriter>(
        [this](const Status& st) { post_([this, st] { Written(st); }); });
  } catch (const std::exception& e) {  // no thread: checkpoints are written inline
    spdlog::warn("checkpoint writer thread not started ({}): writing checkpoints inline", e.what());
  }
}

void Checkpointer::Save(GhostSnapshot snapshot) {
  if (!writer_) {
    SaveFinal(snapshot);
    return;
  }
  const size_t n = snapshot.states.size();
  if (!writer_->Submit(path_, std::move(snapshot))) {
    spdlog::debug("the previous checkpoint was still waiting for the disk: replaced");
  }
  spdlog::debug("{} block states (ghosts and live) handed to the checkpoint writer", n);
}

void Checkpointer::SaveFinal(const GhostSnapshot& snapshot) {
  if (writer_) writer_->Stop();
  const Status st = SaveGhosts(path_, snapshot);
  Written(st);
  if (st.ok()) {
    spdlog::debug("saved {} block states (ghosts and live) to {}", snapshot.states.size(), path_);
  }
}

void Checkpointer::Written(const Status& st) {
  if (st.ok()) {
    last_error_.clear();
  } else if (st.message != last_error_) {
    spdlog::error("ghost checkpoint not written: {}", st.message);
    last_error_ = st.message;
  }
}

}  // namespace cxltier::service
