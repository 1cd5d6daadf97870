#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace cxltier::service {
namespace {

constexpr char kMagic[8] = {'C', 'X', 'L', 'G', 'H', 'O', 'S', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 24;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

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

}  // namespace

std::string SaveGhosts(const std::string& path, const std::vector<BlockState>& ghosts) {
  std::string buf(kHeader, '\0');
  std::memcpy(buf.data(), kMagic, 8);
  const uint32_t entry = sizeof(BlockState);
  const uint64_t count = ghosts.size();
  std::memcpy(buf.data() + 8, &kVersion, 4);
  std::memcpy(buf.data() + 12, &entry, 4);
  std::memcpy(buf.data() + 16, &count, 8);
  buf.append(reinterpret_cast<const char*>(ghosts.data()), ghosts.size() * sizeof(BlockState));
  const uint64_t sum = XXH64(buf.data(), buf.size(), 0);
  buf.append(reinterpret_cast<const char*>(&sum), 8);

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(tmp);
  if (!WriteAll(fd, buf.data(), buf.size()) || ::fsync(fd) != 0) {
    const std::string err = Errno("writing " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());  // the previous checkpoint stays as it was
    return err;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = Errno("rename to " + path);
    ::unlink(tmp.c_str());
    return err;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

LoadedGhosts LoadGhosts(const std::string& path) {
  LoadedGhosts out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  out.found = true;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    out.error = Errno(path);
    return out;
  }
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto set_aside = [&](const std::string& why) {
    const std::string aside = path + ".corrupt";
    std::filesystem::rename(path, aside);
    out.error = path + ": " + why + "; set aside as " + aside + ", starting without ghosts";
    return out;
  };
  if (buf.size() < kHeader + 8 || std::memcmp(buf.data(), kMagic, 8) != 0) {
    return set_aside("not a ghost checkpoint (bad magic or too short)");
  }
  uint32_t version, entry;
  uint64_t count;
  std::memcpy(&version, buf.data() + 8, 4);
  std::memcpy(&entry, buf.data() + 12, 4);
  std::memcpy(&count, buf.data() + 16, 8);
  if (version != kVersion || entry != sizeof(BlockState)) return set_aside("unknown version");
  if (count > (buf.size() - kHeader - 8) / sizeof(BlockState) ||
      buf.size() != kHeader + count * sizeof(BlockState) + 8) {
    return set_aside("truncated or padded (size does not match the count)");
  }
  uint64_t sum;
  std::memcpy(&sum, buf.data() + buf.size() - 8, 8);
  if (XXH64(buf.data(), buf.size() - 8, 0) != sum) return set_aside("checksum mismatch");
  out.ghosts.resize(count);
  std::memcpy(out.ghosts.data(), buf.data() + kHeader, count * sizeof(BlockState));
  return out;
}

}  // namespace cxltier::service
