// The hostile-client suite's harness: a real cxltierd whose socket a clients
// group may use, an attacker uid and a well-behaved third uid (created here;
// needs root), a good client that is served in the background while an attack
// runs, and the daemon's memory and fds read from /proc.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cxltier/client.h"
#include "cxltier/wire.h"
#include "integration/daemon_harness.h"
#include "models.h"
#include "run_as.h"
#include "shell.h"

namespace cxltier::testing {

inline constexpr const char* kHostileGroup = "cxltier-test-clients";
inline constexpr const char* kEvil = "cxltier-test-evil";
inline constexpr const char* kGood = "cxltier-test-good";
// 2 KiB blocks: one page of pool stride each.
inline constexpr const ModelGeometry& kHostileModel = kTiny4KiB;
inline constexpr uint64_t kHostileStride = 4096;
// A request of the good client must be answered within this, however hard the
// attacker tries (generous: the machines are shared and tests run in parallel).
inline constexpr int kServedWithinMs = 5000;

// Creates the clients group and the attacker and good users (idempotent).
inline bool EnsureHostileUsers() {
  const std::string cmd = std::string("set -e; getent group ") + kHostileGroup +
                          " >/dev/null || groupadd --system " + kHostileGroup + "; for u in " +
                          kEvil + " " + kGood +
                          "; do getent passwd $u >/dev/null || useradd --system -M -N -g " +
                          kHostileGroup + " -s /usr/sbin/nologin $u; done 2>&1";
  const ShellResult r = Shell(cmd);
  EXPECT_EQ(r.status, 0) << r.out;
  return r.status == 0;
}

// An attacker in its own process, as kEvil: `setup` builds what the attack
// holds (connections, blocks) and returns one byte for the test; the process
// then keeps all of it until Release().
class HeldAttacker {
 public:
  explicit HeldAttacker(const std::function<char()>& setup) {
    const Identity evil = IdentityOf(kEvil);
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return;
    pid_ = ForkAlone();
    if (pid_ == 0) {
      char c = DropTo(evil) ? setup() : '!';
      if (write(from[1], &c, 1) != 1) _exit(1);
      if (read(to[0], &c, 1) < 0) _exit(1);  // hold everything until told
      _exit(0);
    }
    close(to[0]);
    close(from[1]);
    release_fd_ = to[1];
    if (read(from[0], &report_, 1) != 1) report_ = 0;
    close(from[0]);
  }
  ~HeldAttacker() { Release(); }
  HeldAttacker(const HeldAttacker&) = delete;
  HeldAttacker& operator=(const HeldAttacker&) = delete;

  // What setup returned; 0 if the process died first, '!' if it could not
  // become kEvil.
  char report() const { return report_; }
  // Lets the process exit (dropping all it held) and reaps it.
  void Release() {
    if (pid_ <= 0) return;
    if (write(release_fd_, "x", 1) != 1) kill(pid_, SIGKILL);
    close(release_fd_);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int release_fd_ = -1;
  char report_ = 0;
};

// A daemon whose socket (mode 0660, group kHostileGroup) the test users reach.
class HostileDaemon : public DaemonProcess {
 public:
  explicit HostileDaemon(const std::string& extra_toml = "", const std::string& daemon_keys = "")
      : DaemonProcess(extra_toml, "",
                      std::string("socket_group = \"") + kHostileGroup + "\"\n" + daemon_keys) {
    chmod(dir().c_str(), 0755);
  }
};

// Under ASan the daemon's freed memory waits in the allocator's quarantine
// (256 MiB by default) and counts as its own: memory bounds are checked in
// the plain build (the unit stage), everything else in both.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kMemoryIsMeasurable = false;
#else
inline constexpr bool kMemoryIsMeasurable = true;
#endif

// What the daemon costs, from /proc.
struct DaemonUsage {
  uint64_t rss_bytes = 0;
  uint64_t anon_bytes = 0;
  size_t fds = 0;
};

inline DaemonUsage Usage(pid_t pid) {
  DaemonUsage u;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kib) == 1) u.rss_bytes = kib * 1024;
    if (std::sscanf(line.c_str(), "RssAnon: %llu kB", &kib) == 1) u.anon_bytes = kib * 1024;
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++u.fds;
  }
  return u;
}

// Total CPU time (user + system) of a process, in seconds, from /proc/<pid>/stat.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close_paren = s.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream rest(s.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A raw connection to the daemon (no hello), or -1.
inline int RawConnect(const std::string& socket_path) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, socket_path.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// Writes all of `bytes` (blocking). False on error.
inline bool WriteAll(int fd, const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// True once the peer closed `fd` (a read returns 0 or an error); reads and
// drops whatever is pending. Waits at most `timeout`.
inline bool ClosedByPeer(int fd, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    if (n > 0) continue;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A memfd pool of `blocks` blocks, sealed against shrinking. -1 on failure.
inline int SealedPool(uint32_t blocks, const char* name = "hostile-pool") {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(blocks * kHostileStride)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Registers a sealed pool of `blocks` blocks (memfd `name`) on `c` and
// admits the blocks of `sequence` 0..blocks-1 at their own indexes: the
// keys and the daemon's answers in `keys` and `admitted`.
inline Status AdmitSealedPool(Client& c, uint32_t blocks, uint64_t sequence, const char* name,
                              std::vector<BlockKey>* keys,
                              std::vector<wire::AdmitResult>* admitted) {
  const int fd = SealedPool(blocks, name);
  if (fd < 0) return Status::Fail(wire::ErrorCode::kInternal, "cannot make a sealed pool");
  uint32_t pool = 0;
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < blocks; ++i) {
    keys->push_back(BlockKey::FromSequence(sequence, i));
    entries.push_back({keys->back(), i});
  }
  Status st = c.RegisterMemfdPool(fd, blocks * kHostileStride, kHostileStride, blocks, &pool);
  return st.ok() ? c.Admit(pool, entries, admitted) : st;
}

// Round trips of another uid's client (the prober), filed by the phase of
// the attack they began in: 0 quiet, 1 under attack, 4 a baseline under
// load (filed as 2: the attacker holds what it took, but sends nothing);
// 3: not sampled; 2: the prober leaves. In shared memory, so the prober can
// be another process.
struct ProbeShared {
  static constexpr int kHolding = 4;  // the phase filed in bucket 2
  std::atomic<int> phase{3};
  static constexpr int kSamples = 16384;
  std::atomic<int> count[3] = {0, 0, 0};
  int64_t sample_us[3][kSamples];
  std::atomic<int> failures{0};

  // The 99th percentile of a phase's round trips in microseconds (-1: none).
  int64_t P99(int of) const { return Percentile(of, 99); }
  int64_t Percentile(int of, int pct) const {
    const int n = std::min(count[of].load(), kSamples);
    std::vector<int64_t> v(sample_us[of], sample_us[of] + n);
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min<size_t>(v.size() - 1, v.size() * pct / 100)];
  }
};

// The prober (run it as its own process): becomes kGood, admits 8 blocks,
// then asks QueryTiers of them every 2 ms and files each round trip under
// the phase it began in (a quiet one only if it also ended quiet), until
// the phase is 2.
inline int Prober(const std::string& socket, ProbeShared* sh) {
  if (!DropTo(IdentityOf(kGood))) return 1;
  Status st;
  auto c = Client::Connect({socket, kHostileModel, 64, "prober"}, &st);
  std::vector<BlockKey> keys;
  std::vector<wire::AdmitResult> res;
  if (!c || !AdmitSealedPool(*c, 8, 4243, "prober-pool", &keys, &res).ok()) {
    sh->failures.fetch_add(1);
    return 1;
  }
  for (int phase; (phase = sh->phase.load()) != 2;) {
    std::vector<Tier> tiers;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = c->QueryTiers(keys, &tiers).ok() && tiers.size() == keys.size();
    const auto took = std::chrono::steady_clock::now() - t0;
    if (!ok) sh->failures.fetch_add(1);
    // A quiet or holding sample must end in its phase; an attack's counts
    // however long it took.
    const int bucket = phase == ProbeShared::kHolding ? 2 : phase;
    if (ok && (phase == 1 ||
               ((phase == 0 || phase == ProbeShared::kHolding) && sh->phase.load() == phase))) {
      const int i = sh->count[bucket].fetch_add(1);
      if (i < ProbeShared::kSamples) {
        sh->sample_us[bucket][i] =
            std::chrono::duration_cast<std::chrono::microseconds>(took).count();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return 0;
}

// How the good client fared.
struct GoodReport {
  uint64_t rounds = 0;
  uint64_t failures = 0;
  int64_t max_round_ms = 0;
  std::string error;  // the first failure
};

// A well-behaved client of a third uid (kGood), in its own process: it
// connects, registers a sealed memfd pool, admits 8 blocks, then loops over
// shared-memory observations, a socket Report, QueryTiers and Stats until
// stopped. Every round's duration is recorded in shared memory, so a stuck
// round shows even if the process never finishes it.
class GoodClient {
 public:
  GoodClient() {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    shared_ = p == MAP_FAILED ? nullptr : new (p) Shared();
  }
  ~GoodClient() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (shared_) munmap(shared_, sizeof(Shared));
  }
  GoodClient(const GoodClient&) = delete;
  GoodClient& operator=(const GoodClient&) = delete;

  // Starts the client and waits (bounded) until it has finished one round.
  bool Start(const std::string& socket_path) {
    if (!shared_) return false;
    const Identity good = IdentityOf(kGood);
    pid_ = ForkAlone();
    if (pid_ < 0) return false;
    if (pid_ == 0) _exit(Run(socket_path, good));
    return WaitFor([this] { return shared_->rounds.load() > 0 || shared_->failures.load() > 0; });
  }

  GoodReport Stop() {
    GoodReport r;
    if (pid_ <= 0 || !shared_) {
      r.failures = 1;
      r.error = "not started";
      return r;
    }
    shared_->stop = true;
    const bool exited = WaitFor(
        [this] {
          int st = 0;
          return waitpid(pid_, &st, WNOHANG) == pid_;
        },
        std::chrono::milliseconds(3 * kServedWithinMs));
    r.rounds = shared_->rounds.load();
    r.failures = shared_->failures.load();
    r.max_round_ms = shared_->max_round_ms.load();
    r.error = shared_->error;
    if (!exited) {
      const int64_t started = shared_->round_started_ms.load();
      r.failures += 1;
      if (r.error.empty()) {
        r.error = "a round has not finished after " + std::to_string(NowMs() - started) + " ms";
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    return r;
  }

 private:
  struct Shared {
    std::atomic<uint64_t> rounds{0};
    std::atomic<uint64_t> failures{0};
    std::atomic<int64_t> max_round_ms{0};
    std::atomic<int64_t> round_started_ms{0};
    std::atomic<bool> stop{false};
    char error[256] = {};
  };

  static int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void Fail(const std::string& what) {
    if (shared_->failures.fetch_add(1) == 0) {
      std::snprintf(shared_->error, sizeof(shared_->error), "%s", what.c_str());
    }
  }

  int Run(const std::string& socket_path, const Identity& good) {
    if (!DropTo(good)) {
      Fail("cannot become the good user");
      return 1;
    }
    Status st;
    shared_->round_started_ms = NowMs();
    auto c = Client::Connect({socket_path, kHostileModel, 64, "good"}, &st);
    if (!c) {
      Fail("connect: " + st.message);
      return 1;
    }
    std::vector<BlockKey> keys;
    std::vector<wire::AdmitResult> admitted;
    if (!(st = AdmitSealedPool(*c, 8, 4242, "good-pool", &keys, &admitted)).ok()) {
      Fail("setup: " + st.message);
      return 1;
    }
    while (!shared_->stop) {
      const int64_t t0 = NowMs();
      shared_->round_started_ms = t0;
      for (const wire::AdmitResult& r : admitted) c->Observe(r.slot, 1.0f);
      std::vector<wire::Observation> obs{{admitted[0].slot, 0.5f}};
      std::vector<Tier> tiers;
      std::string json;
      if (!(st = c->Report(obs)).ok()) Fail("report: " + st.message);
      if (!(st = c->QueryTiers(keys, &tiers)).ok() || tiers.size() != keys.size()) {
        Fail("query-tiers: " + st.message);
      }
      for (Tier t : tiers) {
        if (t == Tier::kNone) Fail("a held block reads as not resident");
      }
      if (!(st = c->Stats("status", &json)).ok()) Fail("stats: " + st.message);
      const int64_t took = NowMs() - t0;
      if (took > shared_->max_round_ms) shared_->max_round_ms = took;
      if (took > kServedWithinMs) Fail("a round took " + std::to_string(took) + " ms");
      shared_->rounds.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

  Shared* shared_ = nullptr;
  pid_t pid_ = -1;
};

// The three checks every attack test ends with: the daemon lives, the good
// client was served throughout, and the daemon's memory and fds stayed bounded.
inline void ExpectHealthy(HostileDaemon& d, GoodClient& good, uint64_t max_anon_bytes,
                          size_t max_fds) {
  EXPECT_TRUE(d.Alive()) << d.Log();
  const DaemonUsage u = Usage(d.pid());
  const GoodReport r = good.Stop();
  EXPECT_GT(r.rounds, 0u) << r.error;
  EXPECT_EQ(r.failures, 0u) << r.error;
  EXPECT_LE(r.max_round_ms, kServedWithinMs);
  if (kMemoryIsMeasurable) {
    EXPECT_LE(u.anon_bytes, max_anon_bytes) << "daemon's own memory";
  }
  EXPECT_LE(u.fds, max_fds) << "daemon's fds";
}

}  // namespace cxltier::testing
