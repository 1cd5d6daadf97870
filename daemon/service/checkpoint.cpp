#include "service/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>

#include "cxltier/detail/errno_text.h"

namespace cxltier::service {
namespace {

// Layout (little-endian, as the machine writes it):
//   magic "CXLGHOST" 8 | version u32 | entry bytes u32 (64) | count u64
//   versions 3 and 4: clock tick u64 | resume tick u64
//   count x BlockState (64 B)
//   versions 2 to 4: count x owner u32
// Version 4 is version 3 whose keys are made with the state directory's key
// secret (service/engine_keys.h); up to 3 they are the client's key XORed
// with a function of the owner's uid.
//   XXH64 (seed 0) of everything before it, u64
constexpr char kMagic[8] = {'C', 'X', 'L', 'G', 'H', 'O', 'S', 'T'};
constexpr uint32_t kVersionStatesOnly = 1;
constexpr uint32_t kVersionOwners = 2;
constexpr uint32_t kVersionClock = 3;
constexpr uint32_t kVersion = 4;
constexpr size_t kHeader = 24;
constexpr size_t kClockBytes = 16;  // from version 3, right after the header

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct HashFree {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};
using Hash = std::unique_ptr<XXH64_state_t, HashFree>;

Hash NewHash() {
  Hash h(XXH64_createState());
  if (h) XXH64_reset(h.get(), 0);
  return h;
}

// Writes `n` bytes and folds them into the checksum.
bool Emit(int fd, XXH64_state_t* h, const void* data, size_t n) {
  XXH64_update(h, data, n);
  return WriteAll(fd, data, n);
}

}  // namespace

Status SaveGhosts(const std::string& path, const std::vector<BlockState>& ghosts,
                  const std::vector<uint32_t>& owners, CheckpointClock clock, bool keyed) {
  if (!owners.empty() && owners.size() != ghosts.size()) {
    return Status::Internal("checkpoint: " + std::to_string(owners.size()) + " owners for " +
                            std::to_string(ghosts.size()) + " states");
  }
  Hash h = NewHash();
  if (!h) return Status::Internal("checkpoint: out of memory");
  char header[kHeader + kClockBytes];
  const uint32_t entry = sizeof(BlockState);
  const uint64_t count = ghosts.size();
  clock.resume_tick = std::max(clock.resume_tick, clock.tick);
  std::memcpy(header, kMagic, 8);
  const uint32_t version = keyed ? kVersion : kVersionClock;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &entry, 4);
  std::memcpy(header + 16, &count, 8);
  std::memcpy(header + kHeader, &clock.tick, 8);
  std::memcpy(header + kHeader + 8, &clock.resume_tick, 8);

  const std::string tmp = path + ".tmp";
  // A new file, never one (or a link) found there: in a state directory
  // others can write, a link planted at the temporary name would have had
  // the daemon truncate and overwrite whatever it pointed at.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Internal(detail::ErrnoText(tmp));
  // Written straight from the caller's arrays: no second copy of a million states.
  bool ok = Emit(fd, h.get(), header, sizeof(header)) &&
            Emit(fd, h.get(), ghosts.data(), ghosts.size() * sizeof(BlockState));
  if (ok && owners.empty()) {
    const std::vector<uint32_t> unknown(std::min<size_t>(ghosts.size(), 1u << 16), kUnknownOwner);
    for (size_t left = ghosts.size(); ok && left > 0;) {
      const size_t n = std::min(left, unknown.size());
      ok = Emit(fd, h.get(), unknown.data(), n * sizeof(uint32_t));
      left -= n;
    }
  } else if (ok) {
    ok = Emit(fd, h.get(), owners.data(), owners.size() * sizeof(uint32_t));
  }
  const uint64_t sum = XXH64_digest(h.get());
  if (!ok || !WriteAll(fd, &sum, 8) || ::fsync(fd) != 0) {
    const std::string err = detail::ErrnoText("writing " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());  // the previous checkpoint stays as it was
    return Status::Internal(err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = detail::ErrnoText("rename to " + path);
    ::unlink(tmp.c_str());
    return Status::Internal(err);
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

LoadedGhosts LoadGhosts(const std::string& path) {
  LoadedGhosts out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      out.found = true;
      out.status = Status::Internal(detail::ErrnoText(path));
    }
    return out;
  }
  out.found = true;
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{fd};
  // Renamed, never over an earlier one (each may be all that is left of
  // some run's ghosts): `path.<suffix>`, else `.1`, `.2`, ... while taken.
  auto set_aside = [&](const std::string& why, const std::string& suffix = "corrupt") {
    out.ghosts.clear();
    out.owners.clear();
    std::string aside = path + "." + suffix;
    int err = 0;
    for (int n = 1; n <= 1000; ++n) {
      err = ::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, aside.c_str(), RENAME_NOREPLACE) == 0
                ? 0
                : errno;
      // A filesystem (or a seccomp filter) without RENAME_NOREPLACE: look,
      // then rename.
      if (err == EINVAL || err == ENOSYS || err == EPERM || err == ENOTSUP) {
        struct stat there {};
        err = ::lstat(aside.c_str(), &there) == 0          ? EEXIST
              : ::rename(path.c_str(), aside.c_str()) == 0 ? 0
                                                           : errno;
      }
      if (err != EEXIST) break;
      aside = path + "." + suffix + "." + std::to_string(n);
    }
    out.status =
        Status::Internal(path + ": " + why +
                         (err ? "; could not set it aside (" + std::string(std::strerror(err)) + ")"
                              : "; set aside as " + aside) +
                         ", starting without ghosts");
    return out;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    out.status = Status::Internal(detail::ErrnoText(path));
    return out;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  char header[kHeader];
  if (size < kHeader + 8 || !ReadAll(fd, header, kHeader) || std::memcmp(header, kMagic, 8) != 0) {
    return set_aside("not a ghost checkpoint (bad magic or too short)");
  }
  uint32_t version, entry;
  uint64_t count;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&entry, header + 12, 4);
  std::memcpy(&count, header + 16, 8);
  if (version > kVersion && version < 1000) {
    // A newer daemon's file, found after a downgrade: kept whole under its
    // version's name for the next upgrade to take back by hand.
    return set_aside("written by a newer cxltierd (version " + std::to_string(version) +
                         "; this one reads versions " + std::to_string(kVersionStatesOnly) +
                         " to " + std::to_string(kVersion) + ")",
                     "v" + std::to_string(version));
  }
  if (version < kVersionStatesOnly || version > kVersion || entry != sizeof(BlockState)) {
    return set_aside("unknown version");
  }
  const bool has_owners = version >= kVersionOwners;
  const uint64_t head = kHeader + (version >= kVersionClock ? kClockBytes : 0);
  const uint64_t per_state = sizeof(BlockState) + (has_owners ? sizeof(uint32_t) : 0);
  if (size < head + 8 || count > (size - head - 8) / per_state ||
      size != head + count * per_state + 8) {
    return set_aside("truncated or padded (size does not match the count)");
  }
  Hash h = NewHash();
  if (!h) {
    out.status = Status::Internal(path + ": out of memory");
    return out;
  }
  XXH64_update(h.get(), header, kHeader);
  CheckpointClock clock;
  if (version >= kVersionClock) {
    char bytes[kClockBytes];
    if (!ReadAll(fd, bytes, kClockBytes)) return set_aside("truncated while reading");
    XXH64_update(h.get(), bytes, kClockBytes);
    std::memcpy(&clock.tick, bytes, 8);
    std::memcpy(&clock.resume_tick, bytes + 8, 8);
  }
  out.ghosts.resize(count);
  if (!ReadAll(fd, out.ghosts.data(), count * sizeof(BlockState))) {
    return set_aside("truncated while reading");
  }
  XXH64_update(h.get(), out.ghosts.data(), count * sizeof(BlockState));
  if (has_owners) {
    out.owners.resize(count);
    if (!ReadAll(fd, out.owners.data(), count * sizeof(uint32_t))) {
      return set_aside("truncated while reading");
    }
    XXH64_update(h.get(), out.owners.data(), count * sizeof(uint32_t));
  } else {
    out.owners.assign(count, kUnknownOwner);
  }
  uint64_t sum;
  if (!ReadAll(fd, &sum, 8)) return set_aside("truncated while reading");
  if (XXH64_digest(h.get()) != sum) return set_aside("checksum mismatch");
  // No state may be ahead of the clock the next daemon starts at: a file
  // without a clock (versions 1 and 2) resumes at its latest touch.
  uint64_t latest = 0;
  for (const BlockState& g : out.ghosts) latest = std::max(latest, g.touch_time);
  if (version < kVersionClock) clock.tick = latest;
  clock.resume_tick = std::max({clock.resume_tick, clock.tick, latest});
  out.clock = clock;
  out.version = version;
  return out;
}

CheckpointWriter::CheckpointWriter(Done done, Sink sink)
    : done_(std::move(done)),
      sink_(sink ? std::move(sink) : Sink([](const std::string& path, const GhostSnapshot& s) {
        return SaveGhosts(path, s);
      })),
      thread_([this] { Run(); }) {}

CheckpointWriter::~CheckpointWriter() { Stop(); }

bool CheckpointWriter::Submit(std::string path, GhostSnapshot snapshot) {
  std::optional<Job> old;  // freed outside the lock
  {
    std::lock_guard lock(mu_);
    if (stop_) return false;
    old = std::move(pending_);
    if (old) ++replaced_;
    pending_ = Job{std::move(path), std::move(snapshot)};
  }
  cv_.notify_all();
  return !old;
}

void CheckpointWriter::Stop() {
  std::optional<Job> dropped;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    dropped = std::move(pending_);
    pending_.reset();
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool CheckpointWriter::stopped() const {
  std::lock_guard lock(mu_);
  return stop_;
}

uint64_t CheckpointWriter::written() const {
  std::lock_guard lock(mu_);
  return written_;
}

uint64_t CheckpointWriter::replaced() const {
  std::lock_guard lock(mu_);
  return replaced_;
}

bool CheckpointWriter::busy() const {
  std::lock_guard lock(mu_);
  return writing_ || pending_.has_value();
}

void CheckpointWriter::Run() {
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (stop_) return;
      job = std::move(pending_);
      pending_.reset();
      writing_ = true;
    }
    Status err;
    try {
      err = sink_(job->path, job->snapshot);
    } catch (const std::exception& e) {  // bad_alloc: nothing may leave this thread
      err = Status::Internal(std::string("checkpoint: ") + e.what());
    }
    job.reset();
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      ++written_;
    }
    cv_.notify_all();
    try {
      if (done_) done_(err);
    } catch (const std::exception&) {  // a report that could not be posted is lost, not fatal
    }
  }
}

}  // namespace cxltier::service
