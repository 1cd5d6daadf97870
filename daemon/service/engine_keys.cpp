#include "service/engine_keys.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cxltier/detail/errno_text.h"

namespace cxltier::service {
namespace {

static_assert(EngineKeys::kSecretBytes >= XXH3_SECRET_SIZE_MIN);

// Random bytes from the kernel. getrandom blocks only before its pool is
// initialised (early boot), and returns at most 33,554,431 bytes a call.
Result<EngineKeys::Secret> Draw() {
  EngineKeys::Secret s;
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return detail::ErrnoStatus("getrandom");
    got += static_cast<size_t>(n);
  }
  return s;
}

// What ReadSecret found.
enum class Found { kSecret, kNone, kUnfit };

// `path`'s secret; kNone when there is no file, kUnfit when the file is not
// a regular file of kSecretBytes that only this user may read (it is then
// not used). Any other failure to read it is an error: a new secret would
// lose every ghost saved under the old one.
Result<Found> ReadSecret(const std::string& path, EngineKeys::Secret* s) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Found::kNone;
    if (errno == ELOOP) return Found::kUnfit;  // a link: not ours
    return detail::ErrnoStatus("reading " + path);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const Status err = detail::ErrnoStatus("fstat " + path);
    close(fd);
    return err;
  }
  if (!S_ISREG(st.st_mode) || st.st_size != EngineKeys::kSecretBytes || (st.st_mode & 077) != 0 ||
      st.st_uid != geteuid()) {
    close(fd);
    return Found::kUnfit;
  }
  const ssize_t n = pread(fd, s->data(), s->size(), 0);
  const Status err = n < 0 ? detail::ErrnoStatus("reading " + path) : Status::Ok();
  close(fd);
  if (!err.ok()) return err;
  if (n != static_cast<ssize_t>(s->size())) {
    return Status::Fail(wire::ErrorCode::kInternal, path + ": short read");
  }
  return Found::kSecret;
}

Status WriteSecret(const std::string& dir, const EngineKeys::Secret& s) {
  const std::string tmp = dir + "/key-secret.tmp", path = dir + "/key-secret";
  unlink(tmp.c_str());  // O_EXCL below: never through a file or link left there
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return detail::ErrnoStatus("creating " + tmp);
  const bool written =
      write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()) && fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  if (!written) {
    errno = saved;
    unlink(tmp.c_str());
    return detail::ErrnoStatus("writing " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return detail::ErrnoStatus("renaming " + tmp);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Status::Ok();
}

}  // namespace

EngineKeys::EngineKeys() {
  Result<Secret> s = Draw();
  if (!s.ok()) {
    // Not secret, only not fixed: keys another uid could aim at again.
    spdlog::critical(
        "no random secret for the engine's keys ({}): keys of different users "
        "are kept apart by a guessable one",
        s.status().message);
    for (size_t i = 0; i < secret_.size(); i += 8) {
      const uint64_t x = XXH3_64bits_withSeed(&i, sizeof i, reinterpret_cast<uintptr_t>(this));
      std::memcpy(secret_.data() + i, &x, 8);
    }
    return;
  }
  secret_ = *s;
}

Result<EngineKeys> EngineKeys::Read(const std::string& dir) {
  Secret s;
  Result<Found> found = ReadSecret(dir + "/key-secret", &s);
  if (!found.ok()) return found.status();
  if (*found != Found::kSecret) {
    return Status::Fail(wire::ErrorCode::kInternal, dir + "/key-secret: none that may be used");
  }
  return EngineKeys(s);
}

Result<EngineKeys> EngineKeys::InStateDir(const std::string& dir, bool* created) {
  if (created) *created = false;
  const std::string path = dir + "/key-secret";
  Secret s;
  Result<Found> found = ReadSecret(path, &s);
  if (!found.ok()) return found.status();
  if (*found == Found::kSecret) return EngineKeys(s);
  if (*found == Found::kUnfit) {
    spdlog::warn(
        "{} is not a file of {} bytes that only this user may read; drawing a new one (the "
        "ghosts saved under the old one are not found again)",
        path, kSecretBytes);
  }
  Result<Secret> drawn = Draw();
  if (!drawn.ok()) return drawn.status();
  // Not kept, it would make checkpoints whose ghosts no later run finds.
  if (Status st = WriteSecret(dir, *drawn); !st.ok()) return st;
  if (created) *created = true;
  return EngineKeys(*drawn);
}

BlockKey EngineKeys::Of(const BlockKey& key, uid_t uid) const {
  const uint64_t in[3] = {key.hi, key.lo, uint64_t{uid}};
  const XXH128_hash_t h = XXH3_128bits_withSecret(in, sizeof in, secret_.data(), secret_.size());
  return BlockKey{h.high64, h.low64};
}

BlockKey EngineKeys::FromUnkeyed(const BlockKey& unkeyed, uid_t owner) const {
  const uint64_t mask = 0x9e3779b97f4a7c15ULL * (uint64_t{owner} + 1);
  return Of(BlockKey{unkeyed.hi ^ mask, unkeyed.lo}, owner);
}

}  // namespace cxltier::service
