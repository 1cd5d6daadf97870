// A real cxltierd, real clients, real sockets, shared memory and syscalls.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <numaif.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "cxltier/cxltier.h"
#include "cxltier/wire.h"
#include "daemon_harness.h"
#include "engine/policy.h"
#include "models.h"
#include "numa/migrator.h"
#include "service/checkpoint.h"
#include "service/engine_keys.h"
#include "shell.h"

namespace cxltier {
namespace {

using testing::DaemonProcess;
using testing::WaitFor;
using testing::WaitTicks;

// 8 KiB blocks: one layer, one KV head of dim 128, fp16, 16 tokens.
constexpr uint64_t kBlock = 8192;

BlockKey K(uint64_t i) { return BlockKey::FromSequence(77, i); }

struct MemfdPool {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  // `written`: every byte written now; else the file is all holes.
  explicit MemfdPool(uint32_t blocks, bool written = true) : bytes(blocks * kBlock) {
    fd = memfd_create("test-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    base = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    for (uint64_t i = 0; written && i < bytes; ++i) base[i] = static_cast<uint8_t>(i * 13);
  }
  ~MemfdPool() {
    munmap(base, bytes);
    close(fd);
  }
};

std::unique_ptr<Client> Connect(const DaemonProcess& d, const std::string& name = "t",
                                uint32_t slots = 64) {
  Status st;
  auto c = Client::Connect({d.socket(), kTiny8KiB, slots, name}, &st);
  EXPECT_TRUE(c) << st.message;
  return c;
}

nlohmann::json StatusOf(const DaemonProcess& d, const std::string& what = "status") {
  std::string text;
  const Status st = Client::DaemonStats(d.socket(), what, &text);
  EXPECT_TRUE(st.ok()) << st.message;
  return nlohmann::json::parse(text, nullptr, false);
}

// An upgrade: a checkpoint of version 3, written before the key secret
// existed, whose keys are the client's key XORed with a function of the
// owner's uid. The daemon makes those keys anew, so the ghost is found again
// by its client's key: on the first start after the upgrade, and on a later
// one whose first start drew the secret but died before its checkpoint.
TEST(Daemon, GhostsSavedBeforeTheKeySecretAreFoundAgain) {
  for (const bool secret_exists : {false, true}) {
    SCOPED_TRACE(secret_exists ? "the secret drawn already" : "no secret yet");
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("cxltierd-unkeyed-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir / "state");
    if (secret_exists) {
      ASSERT_TRUE(service::EngineKeys::InStateDir(dir / "state").ok());
    }
    const BlockKey key = BlockKey::FromSequence(4242, 3);
    BlockState st;
    st.key = BlockKey{key.hi ^ 0x9e3779b97f4a7c15ULL * (uint64_t{getuid()} + 1), key.lo};
    st.touch_count = 5;
    st.touch_time = 7;
    st.score = 2.5;
    ASSERT_EQ(service::SaveGhosts((dir / "state" / "ghosts.bin").string(), {st},
                                  {static_cast<uint32_t>(getuid())}, {10, 10}, /*keyed=*/false)
                  .message,
              "");
    DaemonProcess d("", dir.string());
    ASSERT_TRUE(d.Alive()) << d.Log();
    MemfdPool pool(8);
    auto c = Connect(d, "upgraded");
    ASSERT_TRUE(c);
    uint32_t pool_id = 0;
    ASSERT_TRUE(c->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &pool_id).ok());
    std::vector<wire::AdmitResult> res;
    ASSERT_TRUE(c->Admit(pool_id, std::vector<wire::AdmitEntry>{{key, 0}}, &res).ok());
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].restored, 1) << d.Log();
    EXPECT_EQ(c->SlotState(res[0].slot)->touch_count, 5u);
  }
}

// Two daemons on one state directory, or on one socket: the second is
// refused at its start, saying why, and the first keeps serving (they wrote
// the same checkpoint's temporary file, and the first to stop removed the
// other's socket). A daemon's stop removes only the socket it made.
// A Unix socket listening at `path`, as another program's would; -1 on error.
int socket_fd_listening(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 4) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

TEST(Daemon, ASecondDaemonOnTheSameStateDirOrSocketIsRefused) {
  DaemonProcess a;
  ASSERT_TRUE(a.Alive()) << a.Log();
  std::ifstream in(a.config_path());
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::filesystem::path dir = std::filesystem::path(a.config_path()).parent_path();
  auto with = [&](const std::string& from, const std::string& to, const char* name) {
    std::string text = config;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const std::string socket = (dir / "d.sock").string(), state = (dir / "state").string();
  // The state directory is the daemon's alone: no one else can open it to
  // hold its lock.
  struct stat sd {};
  ASSERT_EQ(stat(state.c_str(), &sd), 0);
  EXPECT_EQ(sd.st_mode & 0777, 0700u);
  const std::string other_socket = with(socket, (dir / "b.sock").string(), "b-socket.toml");
  const std::string other_state = with(state, (dir / "state-b").string(), "b-state.toml");
  auto run = [](const std::string& cfg) {
    return testing::Shell(std::string("timeout 60 ") + DaemonProcess::DaemonPath() + " --config " +
                          cfg + " 2>&1");
  };
  const testing::ShellResult same_state = run(other_socket);
  EXPECT_EQ(same_state.status, 1) << same_state.out;
  EXPECT_NE(same_state.out.find("another cxltierd uses the state directory"), std::string::npos)
      << same_state.out;
  const testing::ShellResult same_socket = run(other_state);
  EXPECT_EQ(same_socket.status, 1) << same_socket.out;
  EXPECT_NE(same_socket.out.find("another cxltierd is starting or listening on this socket"),
            std::string::npos)
      << same_socket.out;
  // The lock file is the daemon's alone: a client that could open it could
  // hold its lock once the daemon stops and keep every later start out.
  struct stat lk {};
  ASSERT_EQ(stat((socket + ".lock").c_str(), &lk), 0);
  EXPECT_EQ(lk.st_mode & 077, 0u);
  EXPECT_EQ(lk.st_uid, geteuid());
  if (geteuid() == 0) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (setgid(54321) != 0 || setuid(54321) != 0) _exit(2);
      _exit(open((socket + ".lock").c_str(), O_RDONLY | O_CLOEXEC) < 0 ? 0 : 1);
    }
    int ws = 0;
    ASSERT_EQ(waitpid(child, &ws, 0), child);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "another uid opened the lock file";
  }
  // A daemon that is starting on a socket holds `<socket>.lock` from its
  // check to its listen: another starting then is refused, not racing it.
  const std::string third = (dir / "c.toml").string();
  {
    std::string text = config;
    for (const auto& [from, to] : {std::pair{state, (dir / "state-c").string()},
                                   std::pair{socket, (dir / "c.sock").string()}}) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
    }
    std::ofstream(third) << text;
  }
  const std::string c_lock = (dir / "c.sock.lock").string();
  {
    const int held =
        open(c_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);  // as a daemon makes it
    ASSERT_GE(held, 0);
    ASSERT_EQ(flock(held, LOCK_EX), 0);
    const testing::ShellResult starting = run(third);
    EXPECT_EQ(starting.status, 1) << starting.out;
    EXPECT_NE(starting.out.find("another cxltierd is starting or listening on this socket"),
              std::string::npos)
        << starting.out;
    close(held);
  }
  auto c = Connect(a, "still-served");
  ASSERT_TRUE(c) << a.Log();
  std::string json;
  EXPECT_TRUE(c->Stats("status", &json).ok());
  c.reset();
  // A's socket file replaced by another program's (A's was removed by hand;
  // no cxltierd can make one while A holds the lock): A's stop leaves it,
  // and a daemon started then finds someone listening there.
  ASSERT_EQ(unlink(socket.c_str()), 0);
  const int other = socket_fd_listening(socket);
  ASSERT_GE(other, 0) << strerror(errno);
  EXPECT_EQ(a.Stop(SIGTERM), 0);
  struct stat st {};
  EXPECT_EQ(stat(socket.c_str(), &st), 0) << "the daemon's stop removed another's socket";
  const testing::ShellResult listened = run(other_state);
  EXPECT_EQ(listened.status, 1) << listened.out;
  EXPECT_NE(listened.out.find("another process listens on this socket"), std::string::npos)
      << listened.out;
  close(other);
}

// The client keeps a duplicate of each memfd pool's fd to register it again
// at a reconnect. When it cannot make one (out of fds), the registration
// fails and says so, instead of succeeding with no fd and failing every
// later reconnect.
TEST(Daemon, AMemfdPoolIsRegisteredOnlyWithTheFdItsReconnectNeeds) {
  DaemonProcess d;
  MemfdPool pool(16);
  auto a = Connect(d, "dup");
  ASSERT_TRUE(a);
  const int lowest_free = dup(0);
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit none = was;
  none.rlim_cur = static_cast<rlim_t>(lowest_free);  // every fd below it is open
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  uint32_t pid = 0;
  const Status first = a->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 16, &pid);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
  if (first.ok()) {
    const Status st = a->Reconnect();
    EXPECT_TRUE(st.ok()) << "registered without the fd a reconnect needs: " << st.message;
  } else {
    EXPECT_NE(first.message.find("duplicating the pool's memfd"), std::string::npos)
        << first.message;
  }
  ASSERT_TRUE(a->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 16, &pid).ok());
  const Status st = a->Reconnect();
  EXPECT_TRUE(st.ok()) << st.message;
}

TEST(Daemon, ObservationsMoveScoresAndStateSurvivesReleaseAndRestart) {
  // LFU, whose score is the touch count (the default's is an EMA).
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\npolicy = \"lfu\"\n");
  MemfdPool pool(16);
  auto a = Connect(d, "a");
  ASSERT_TRUE(a);
  uint32_t pid = 0;
  ASSERT_TRUE(a->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 16, &pid).ok());
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < 4; ++i) entries.push_back({K(i), i});
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(a->Admit(pid, entries, &res).ok());
  ASSERT_EQ(res.size(), 4u);
  EXPECT_EQ(res[0].restored, 0);

  // Observations through shared memory become touches (one per tick) and score.
  const uint32_t s0 = res[0].slot;
  for (int round = 0; round < 5; ++round) {
    a->Observe(s0, 1.0f);
    WaitTicks(*a, 2);
  }
  const uint32_t touches = a->SlotState(s0)->touch_count;
  EXPECT_GE(touches, 5u);
  EXPECT_GE(a->SlotState(s0)->score, 5.0);  // LFU: score = touch count
  EXPECT_EQ(a->SlotState(res[1].slot)->touch_count, 0u);

  // A held key admitted again: its slot, where it is held; anywhere else (or
  // one key at two blocks in one admit) is refused, and nothing changes.
  ASSERT_TRUE(a->Admit(pid, std::vector<wire::AdmitEntry>{{K(0), 0}, {K(0), 0}}, &res).ok());
  EXPECT_EQ(res[0].slot, s0);
  Status moved = a->Admit(pid, std::vector<wire::AdmitEntry>{{K(9), 9}, {K(0), 5}}, &res);
  EXPECT_EQ(moved.code, wire::ErrorCode::kBadSlot) << moved.message;
  EXPECT_NE(moved.message.find("is held at pool 0 block 0: release it before admitting it at "
                               "pool 0 block 5"),
            std::string::npos)
      << moved.message;
  moved = a->Admit(pid, std::vector<wire::AdmitEntry>{{K(9), 9}, {K(9), 10}}, &res);
  EXPECT_EQ(moved.code, wire::ErrorCode::kBadSlot) << moved.message;
  EXPECT_NE(moved.message.find("is named twice, at blocks 9 and 10"), std::string::npos)
      << moved.message;
  EXPECT_EQ(a->SlotOf(K(9)), UINT32_MAX);  // all or nothing: K(9) was not admitted
  EXPECT_EQ(a->SlotOf(K(0)), s0);

  // Release, then admit again: the ghost's state comes back.
  ASSERT_TRUE(a->Release(std::vector<BlockKey>{K(0)}).ok());
  ASSERT_TRUE(a->Admit(pid, std::vector<wire::AdmitEntry>{{K(0), 0}}, &res).ok());
  EXPECT_EQ(res[0].restored, 1);
  EXPECT_EQ(a->SlotState(res[0].slot)->touch_count, touches);

  // Another client of the same user cannot take a key that is held.
  auto b = Connect(d, "b");
  uint32_t bpool = 0;
  ASSERT_TRUE(b->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 16, &bpool).ok());
  const Status denied = b->Admit(bpool, std::vector<wire::AdmitEntry>{{K(0), 5}}, &res);
  EXPECT_FALSE(denied.ok());
  EXPECT_EQ(denied.code, wire::ErrorCode::kDenied);
  EXPECT_TRUE(b->Admit(bpool, std::vector<wire::AdmitEntry>{{K(9), 5}}, &res).ok());

  // Restart: ghosts are saved at SIGTERM and loaded at start; clients reconnect.
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  EXPECT_TRUE(std::filesystem::exists(d.dir() / "state" / "ghosts.bin"));
  d.Start();
  EXPECT_NE(d.Log().find("loaded"), std::string::npos) << d.Log();
  ASSERT_TRUE(a->Reconnect().ok());
  const uint32_t again = a->SlotOf(K(0));
  ASSERT_NE(again, UINT32_MAX);
  WaitTicks(*a, 2);
  EXPECT_EQ(a->SlotState(again)->touch_count, touches);
  EXPECT_TRUE(a->SlotState(again)->flags & kFlagRestored);
  const auto st = StatusOf(d);
  EXPECT_GE(st["ghosts_loaded_at_start"].get<uint64_t>(), 4u);
}

TEST(Daemon, MigratesOnOneNodeWithBothTiersAndKeepsEveryByte) {
  DaemonProcess d("[engine]\ntier0_budget = \"8MiB\"\n");
  for (const char* kind : {"memfd", "range"}) {
    // At least 250 steps, then on until both a promotion and a demotion were
    // seen (up to 120 s): a loaded machine may need more than 250 steps.
    const testing::ShellResult r = testing::Shell(
        std::string(CXLTIER_LOADGEN_PATH) + " --socket " + d.socket() + " --pool " + kind +
        " --blocks 48 --block-bytes 1MiB --steps 250 --step-ms 2 --until-moves 1 --seconds 120"
        " --json");
    ASSERT_EQ(r.status, 0) << r.out << d.Log();
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["corrupt_blocks"], 0) << kind;
    EXPECT_EQ(j["blocks_verified"], 48);
    EXPECT_GT(j["touches"].get<uint64_t>(), 500u);
    EXPECT_GT(j["demotions"].get<uint64_t>(), 0u) << kind << "\n" << d.Log();
    EXPECT_GT(j["promotions"].get<uint64_t>(), 0u) << kind;
    EXPECT_EQ(j["migration_failures"], 0) << kind << "\n" << d.Log();
    EXPECT_GT(j["hits"].get<uint64_t>(), 0u);
  }
  const auto st = StatusOf(d);
  EXPECT_TRUE(st["migrations"]["enabled"].get<bool>());
  // Every page of every moved block was present and verified on its target:
  // a move of pages the daemon cannot see must not pass for done.
  EXPECT_GT(st["migrations"]["pages_verified"].get<uint64_t>(), 0u);
  EXPECT_EQ(st["migrations"]["pages_absent"], 0) << st.dump();
  EXPECT_LE(st["tiers"][0]["blocks"].get<uint64_t>(), 8u);
}

size_t CountDaemonFds(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

// The daemon's fds at rest: the fewest over half a second of samples. A session
// the daemon is still closing, or a checkpoint being written, holds an fd for
// a moment; a leaked fd stays in every sample.
size_t SettledDaemonFds(pid_t pid) {
  size_t fewest = CountDaemonFds(pid);
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fewest = std::min(fewest, CountDaemonFds(pid));
  }
  return fewest;
}

// Waits until the daemon holds at most `most` fds (or kEventBound passes) and
// returns the fewest seen: a transient fd goes away however slow the machine
// is, a leaked one stays for the whole bound.
size_t DaemonFdsComeBackTo(pid_t pid, size_t most) {
  size_t fewest = CountDaemonFds(pid);
  WaitFor([&] {
    fewest = std::min(fewest, CountDaemonFds(pid));
    return fewest <= most;
  });
  return fewest;
}

// The inode of `path`, 0 if it does not exist: a checkpoint is written to a
// temporary file renamed over the last one, so each one has a new inode.
ino_t InodeOf(const std::filesystem::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A daemon stopped (SIGKILL or SIGTERM) and restarted over and over while a
// cxltier-loadgen --reconnect runs; RestartLoop's fields say how.
struct RestartLoop {
  bool copy = false;     // --pool copy (reader and writer threads beside the workload)
  int restarts = 10;     // stops, each followed by a start
  bool sigterm = false;  // every other stop a SIGTERM (else all SIGKILL)
  std::string tier0_budget = "4MiB";
};

// The loadgen reconnects each time (re-registers its pool, or hands over its
// tier pools, and re-admits its blocks), no byte of a block changes (copy
// mode: nor under a read lease held across a restart, and no write is lost),
// ghosts come back from the last checkpoint, and neither side leaks fds or
// segments.
void RunRestartLoop(const RestartLoop& o) {
  DaemonProcess d("[engine]\ntier0_budget = \"" + o.tier0_budget + "\"\n", "",
                  "checkpoint_interval_s = 1");
  const std::string out_path = (d.dir() / "loadgen.json").string();
  // The loadgen runs until the restarts are done (SIGUSR1), not for a fixed time.
  std::vector<const char*> args = {"cxltier-loadgen",
                                   "--socket",
                                   d.socket().c_str(),
                                   "--blocks",
                                   "48",
                                   "--block-bytes",
                                   "256KiB",
                                   "--steps",
                                   "20000",
                                   "--step-ms",
                                   "2",
                                   "--until-signal",
                                   "--seconds",
                                   "600",
                                   "--reconnect",
                                   "--expect-no-leaks",
                                   "--json",
                                   "--expect-restored",
                                   "--pool",
                                   o.copy ? "copy" : "memfd",
                                   nullptr};
  const pid_t loadgen = testing::ForkAlone();
  if (loadgen == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    execv(CXLTIER_LOADGEN_PATH, const_cast<char* const*>(args.data()));
    _exit(127);
  }
  struct Reap {  // an ASSERT that returns early must not leave the loadgen running
    pid_t pid;
    ~Reap() {
      if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reap{loadgen};
  auto wait_for_client = [&] {
    nlohmann::json found;
    WaitFor([&] {
      std::string text;
      if (!Client::DaemonStats(d.socket(), "status", &text).ok()) return false;
      const auto j = nlohmann::json::parse(text, nullptr, false);
      if (!j.is_object() || j["clients"] != 1 || j["blocks"].get<uint64_t>() == 0) return false;
      found = j;
      return true;
    });
    return found;
  };
  ASSERT_TRUE(wait_for_client().is_object()) << d.Log();
  const std::filesystem::path checkpoint = d.dir() / "state" / "ghosts.bin";
  std::mt19937 rng(11);
  size_t fewest_fds = 0;
  uint64_t loaded_ghosts = 0;
  for (int round = 0; round < o.restarts; ++round) {
    if (round == 0) {
      // The first stop comes after a checkpoint that holds the client's blocks
      // (one written after it connected), so some restart must find ghosts.
      const ino_t before = InodeOf(checkpoint);
      ASSERT_TRUE(WaitFor([&] { return InodeOf(checkpoint) != before; }))
          << "no checkpoint within 60 s\n"
          << d.Log();
    } else {
      // Random moments; now and then after a checkpoint (every second).
      std::this_thread::sleep_for(std::chrono::milliseconds(400 + rng() % 800));
    }
    const int sig = o.sigterm && round % 2 == 1 ? SIGTERM : SIGKILL;
    ASSERT_EQ(d.Stop(sig), sig == SIGKILL ? -SIGKILL : 0) << d.Log();
    d.Start();
    ASSERT_TRUE(d.Alive()) << d.Log();
    const nlohmann::json st = wait_for_client();
    ASSERT_TRUE(st.is_object()) << "the loadgen did not come back after stop " << round << "\n"
                                << d.Log();
    loaded_ghosts += st["ghosts_loaded_at_start"].get<uint64_t>();
    // Every restarted daemon, serving the same client, comes back to as few
    // fds as the first one had at rest.
    if (round == 0) {
      fewest_fds = SettledDaemonFds(d.pid());
    } else {
      const size_t fds = DaemonFdsComeBackTo(d.pid(), fewest_fds);
      EXPECT_LE(fds, fewest_fds) << "the daemon restarted for stop " << round << " kept " << fds
                                 << " fds for 60 s; the first one had " << fewest_fds;
      fewest_fds = std::min(fewest_fds, fds);
    }
  }
  ASSERT_EQ(kill(loadgen, SIGUSR1), 0);
  int status = 0;
  waitpid(loadgen, &status, 0);
  reap.pid = -1;
  std::ifstream in(out_path);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out << d.Log();
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["corrupt_blocks"], 0) << out;  // every byte of every block, after the restarts
  EXPECT_EQ(j["fd_growth"], 0) << out;
  EXPECT_EQ(j["state_segments_mapped"], 1) << out;
  EXPECT_GT(loaded_ghosts, 0u) << "no restart found ghosts in a checkpoint";
  EXPECT_GT(j["restored_on_reconnect"].get<uint64_t>(), 0u) << out;
  if (!o.copy) {
    EXPECT_EQ(j["blocks_verified"], 48);
    EXPECT_EQ(j["reconnects"], o.restarts);
    return;
  }
  // Copy mode: the live blocks (the daemon placed them), each of the last
  // generation written; reads under leases all whole and of that generation,
  // held ones unchanged across restarts.
  EXPECT_GT(j["blocks_verified"].get<uint64_t>(), 0u) << out;
  EXPECT_GE(j["reconnects"].get<int>(), o.restarts) << out;
  EXPECT_EQ(j["torn_reads"], 0) << out;
  EXPECT_EQ(j["stale_blocks"], 0) << out;
  EXPECT_EQ(j["reader_failures"], 0) << out;
  EXPECT_EQ(j["lease_checks"]["changed_while_held"], 0) << out;
  EXPECT_GT(j["lease_reads"].get<uint64_t>(), 0u) << out;
  EXPECT_GT(j["lease_checks"]["rewrites"].get<uint64_t>(), 0u) << out;
  // A hold's ticks stop with the daemon: readers are holding leases when
  // the loadgen notices the restart.
  EXPECT_GT(j["lease_checks"]["held_across_reconnect"].get<uint64_t>(), 0u) << out;
}

// SIGKILL the daemon ten times at random moments while a loadgen runs, and
// restart it each time.
TEST(Daemon, SigkillRestartLoopLosesNothing) { RunRestartLoop({}); }

// The same in copy mode, four restarts (SIGKILL and SIGTERM), with a tier 0
// of 8 blocks so that blocks move: read leases held across each restart
// read the same bytes after it, and no rewrite is lost.
TEST(Daemon, CopyModeRestartLoopLosesNothing) {
  RunRestartLoop({.copy = true, .restarts = 4, .sigterm = true, .tier0_budget = "2MiB"});
}

// A version-4 checkpoint as the daemon writes it (docs/operations.md): the
// clock, then the states. Only what the restart tests read.
struct CheckpointOnDisk {
  uint64_t tick = 0;
  uint64_t resume_tick = 0;
  std::vector<BlockState> states;
};
bool ReadCheckpoint(const std::filesystem::path& path, CheckpointOnDisk* out) {
  std::ifstream in(path, std::ios::binary);
  const std::string f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint32_t version = 0;
  uint64_t count = 0;
  if (f.size() < 48 || f.compare(0, 8, "CXLGHOST") != 0) return false;
  std::memcpy(&version, f.data() + 8, 4);
  std::memcpy(&count, f.data() + 16, 8);
  if (version != 4 || f.size() != 40 + count * (64 + 4) + 8) return false;
  std::memcpy(&out->tick, f.data() + 24, 8);
  std::memcpy(&out->resume_tick, f.data() + 32, 8);
  out->states.resize(count);
  std::memcpy(out->states.data(), f.data() + 40, count * 64);
  return true;
}

// Regression: the daemon's clock (a state's touch_time is its tick) survives a
// restart, so restored scores keep their value and decay only by the ticks
// that passed. A client holds six blocks with known observations, the daemon
// restarts (SIGTERM: the final checkpoint; SIGKILL: the last periodic one),
// the client reconnects, and
//  - every restored state is in its slot as it was (score, touch time,
//    count, order) and the clock is past it: SIGTERM continues from the
//    final checkpoint's tick (at least the last daemon_ticks seen), SIGKILL
//    from where the next periodic checkpoint was due (the file's tick plus
//    one interval, 50 ticks);
//  - a touch without mass then decays each score by exactly the ticks since
//    its touch, (1 - alpha)^(now - then) for EMA, none for LRU (its score is
//    its order, touch_seq), with now between the daemon_ticks seen before and
//    after the touch; the order of the blocks by score or recency is the one
//    from before the restart, and a block touched after the restart is newer.
// Before the fix the clock restarted at 0: the restored times were ahead of
// it, EMA's decay wrapped (pow gave 0: 5 x 0.01 became 0.01 x obs) and LRU's
// new touches were older than the restored ones.
void RestartKeepsScoresAndOrder(const std::string& policy, int sig) {
  SCOPED_TRACE(policy + (sig == SIGKILL ? " SIGKILL" : " SIGTERM"));
  constexpr uint64_t kTicksPerCheckpoint = 50;  // checkpoint_interval_s = 1, tick_ms = 20
  const bool ema = policy.starts_with("ema:");
  const double alpha = ema ? std::stod(policy.substr(4)) : 0.0;
  DaemonProcess d("[engine]\npolicy = \"" + policy + "\"\ntier0_budget = \"64KiB\"\n", "",
                  sig == SIGKILL ? "checkpoint_interval_s = 1" : "");
  MemfdPool pool(8);
  auto c = Connect(d, "restart");
  ASSERT_TRUE(c);
  uint32_t pool_id = 0;
  ASSERT_TRUE(c->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &pool_id).ok());
  auto key = [](uint64_t i) { return BlockKey::FromSequence(1313, i); };
  constexpr size_t kBlocks = 6;
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < kBlocks; ++i) entries.push_back({key(i), i});
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(c->Admit(pool_id, entries, &res).ok());
  // The first run's clock is well ahead of where a restarted one would be
  // when the client is back (a few ticks), so a clock that restarts fails.
  EXPECT_TRUE(WaitFor([&] { return c->daemon_ticks() >= 150; })) << d.Log();
  // Known observations, one block per tick, in an order that is not the
  // order of their masses: recency and EMA order differ.
  const float masses[kBlocks] = {6, 1, 5, 2, 4, 3};
  for (uint32_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(c->Observe(res[i].slot, masses[i]));
    ASSERT_TRUE(WaitFor([&] { return c->SlotState(res[i].slot)->touch_count == 1; }))
        << "block " << i << " not folded in 60 s";
  }
  std::vector<BlockState> before(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    before[i] = *c->SlotState(res[i].slot);
    if (ema) {
      EXPECT_DOUBLE_EQ(before[i].score, alpha * masses[i]);  // a fresh block's first touch
    } else {
      EXPECT_EQ(before[i].score, static_cast<double>(before[i].touch_seq));
    }
  }
  // The blocks ordered best first: EMA by value at one common time (decay is
  // the same factor for all), LRU by recency.
  auto order = [&](const std::vector<BlockState>& states) {
    uint64_t common = 0;
    for (const BlockState& st : states) common = std::max(common, st.touch_time);
    auto value = [&](const BlockState& st) {
      return ema ? st.score * std::pow(1 - alpha, static_cast<double>(common - st.touch_time))
                 : static_cast<double>(st.touch_seq);
    };
    std::vector<size_t> idx(states.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return value(states[a]) != value(states[b]) ? value(states[a]) > value(states[b])
                                                  : states[a].touch_seq > states[b].touch_seq;
    });
    return idx;
  };
  const std::vector<size_t> order_before = order(before);
  uint64_t latest_touch = 0;
  for (const BlockState& st : before) latest_touch = std::max(latest_touch, st.touch_time);

  const std::filesystem::path ghosts = d.dir() / "state" / "ghosts.bin";
  CheckpointOnDisk on_disk;
  if (sig == SIGKILL) {
    // No final checkpoint: wait for a periodic one that holds every block as
    // the client saw it last.
    // The checkpoint holds engine keys, made with the state directory's secret.
    Result<service::EngineKeys> keys = service::EngineKeys::Read(d.dir() / "state");
    ASSERT_TRUE(keys.ok()) << keys.status().message;
    ASSERT_TRUE(WaitFor([&] {
      CheckpointOnDisk ck;
      if (!ReadCheckpoint(ghosts, &ck)) return false;
      size_t found = 0;
      for (const BlockState& st : ck.states) {
        for (const BlockState& b : before) {
          if (st.key == keys->Of(b.key, getuid()) && st.touch_count == b.touch_count &&
              st.touch_time == b.touch_time && st.score == b.score) {
            ++found;
          }
        }
      }
      on_disk = ck;
      return found == kBlocks;
    })) << "no checkpoint with the blocks in 60 s\n"
        << d.Log();
    EXPECT_GE(on_disk.tick, latest_touch);
    EXPECT_EQ(on_disk.resume_tick, on_disk.tick + kTicksPerCheckpoint);
  }
  const uint64_t ticks_before = c->daemon_ticks();  // D1
  ASSERT_EQ(d.Stop(sig), sig == SIGKILL ? -SIGKILL : 0);
  if (sig == SIGTERM) {
    ASSERT_TRUE(ReadCheckpoint(ghosts, &on_disk));
    EXPECT_GE(on_disk.tick, ticks_before);
    EXPECT_EQ(on_disk.resume_tick, on_disk.tick);  // a stop: the clock resumes where it stopped
  }
  d.Start();
  ASSERT_TRUE(d.Alive()) << d.Log();
  uint64_t restored = 0;
  ASSERT_TRUE(c->Reconnect(&restored).ok()) << d.Log();
  EXPECT_EQ(restored, kBlocks);
  // The new segment shows the resumed clock from the hello on, and the
  // first tick of the restarted daemon comes after it.
  const uint64_t at_hello = c->daemon_ticks();
  EXPECT_GE(at_hello, sig == SIGTERM ? ticks_before : on_disk.resume_tick);
  ASSERT_TRUE(WaitFor([&] { return c->daemon_ticks() > at_hello; })) << d.Log();
  const uint64_t ticks_back = c->daemon_ticks();  // D2: the restarted clock
  // The clock continued: every restored time is in its past.
  EXPECT_GT(ticks_back, latest_touch) << "the clock restarted behind the restored states";
  if (sig == SIGTERM) {
    EXPECT_GT(ticks_back, ticks_before);  // it continues where it stopped
  } else {
    EXPECT_GT(ticks_back, on_disk.tick + kTicksPerCheckpoint);
  }
  std::vector<uint32_t> slots(kBlocks);
  std::vector<BlockState> back(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(c->SlotOf(key(i), &slots[i]));
    back[i] = *c->SlotState(slots[i]);
    EXPECT_TRUE(back[i].flags & kFlagRestored) << i;
    EXPECT_EQ(back[i].score, before[i].score) << i;
    EXPECT_EQ(back[i].touch_time, before[i].touch_time) << i;
    EXPECT_EQ(back[i].touch_count, before[i].touch_count) << i;
    EXPECT_EQ(back[i].touch_seq, before[i].touch_seq) << i;
  }
  EXPECT_EQ(order(back), order_before);

  // One touch without mass each: the score is the restored one minus the
  // decay of the ticks since its touch.
  for (uint32_t i = 0; i < kBlocks; ++i) ASSERT_TRUE(c->Observe(slots[i], 0.0f));
  ASSERT_TRUE(WaitFor([&] {
    for (uint32_t i = 0; i < kBlocks; ++i) {
      if (c->SlotState(slots[i])->touch_count != before[i].touch_count + 1) return false;
    }
    return true;
  })) << "touches after the restart not folded in 60 s";
  const uint64_t ticks_after = c->daemon_ticks();  // D3
  std::vector<BlockState> touched(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    touched[i] = *c->SlotState(slots[i]);
    const uint64_t now = touched[i].touch_time;
    EXPECT_GE(now, ticks_back) << i;
    EXPECT_LE(now, ticks_after) << i;
    EXPECT_GT(now, before[i].touch_time) << i << ": touched before its restored touch";
    if (ema) {
      // Ticks as signed differences: a clock that went back shows as growth.
      auto decay_since = [&](uint64_t then, uint64_t t) {
        return std::pow(1 - alpha, static_cast<double>(t) - static_cast<double>(then));
      };
      const double want = before[i].score * decay_since(before[i].touch_time, now);
      EXPECT_NEAR(touched[i].score, want, want * 1e-12) << i;
      // The bound the clock allows: at least the decay of the ticks up to D2,
      // at most up to D3.
      EXPECT_LE(touched[i].score,
                before[i].score * decay_since(before[i].touch_time, ticks_back) * (1 + 1e-12))
          << i;
      EXPECT_GE(touched[i].score,
                before[i].score * decay_since(before[i].touch_time, ticks_after) * (1 - 1e-12))
          << i;
    } else {
      EXPECT_GT(touched[i].touch_seq, before[i].touch_seq) << i;
      EXPECT_EQ(touched[i].score, static_cast<double>(touched[i].touch_seq)) << i;
    }
  }
  if (ema) {
    EXPECT_EQ(order(touched), order_before);
  }

  // A block admitted after the restart and touched now is newer than every
  // restored one, by clock and by recency.
  std::vector<wire::AdmitResult> fresh;
  ASSERT_TRUE(c->Admit(pool_id, std::vector<wire::AdmitEntry>{{key(100), 7}}, &fresh).ok());
  ASSERT_TRUE(c->Observe(fresh[0].slot, 1.0f));
  ASSERT_TRUE(WaitFor([&] { return c->SlotState(fresh[0].slot)->touch_count == 1; }));
  const BlockState newest = *c->SlotState(fresh[0].slot);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_GT(newest.touch_time, before[i].touch_time) << i;
    EXPECT_GT(newest.touch_seq, before[i].touch_seq) << i;
  }
}

TEST(Daemon, SigtermRestartKeepsEmaScoresAndOrder) {
  RestartKeepsScoresAndOrder("ema:0.01", SIGTERM);
}
TEST(Daemon, SigkillRestartKeepsEmaScoresAndOrder) {
  RestartKeepsScoresAndOrder("ema:0.01", SIGKILL);
}
TEST(Daemon, SigtermRestartKeepsLruScoresAndOrder) { RestartKeepsScoresAndOrder("lru", SIGTERM); }
TEST(Daemon, SigkillRestartKeepsLruScoresAndOrder) { RestartKeepsScoresAndOrder("lru", SIGKILL); }

// A client holding K(1) and K(2) in a memfd pool of 8 blocks.
struct HeldBlocks {
  std::unique_ptr<Client> client;
  MemfdPool pool{8};
  std::vector<uint32_t> slots;
  explicit HeldBlocks(const DaemonProcess& d) : client(Connect(d, "held")) {
    uint32_t id = 0;
    std::vector<wire::AdmitResult> res;
    EXPECT_TRUE(client->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &id).ok());
    EXPECT_TRUE(client->Admit(id, std::vector<wire::AdmitEntry>{{K(1), 0}, {K(2), 1}}, &res).ok());
    for (const auto& r : res) slots.push_back(r.slot);
  }
};

// The Prometheus endpoint, scraped after a real run and checked by
// python3-prometheus-client's parser (tests/integration/check_metrics.py).
TEST(Daemon, MetricsEndpointServesValidPrometheusText) {
  // The per-uid series too ([metrics] per_uid, off by default).
  DaemonProcess d("per_uid = true\n[engine]\ntier0_budget = \"64KiB\"\n");
  const testing::ShellResult lg =
      testing::Shell(std::string(CXLTIER_LOADGEN_PATH) + " --socket " + d.socket() +
                     " --blocks 32 --block-bytes 8KiB --steps 150 --step-ms 2 --json");
  ASSERT_EQ(lg.status, 0) << lg.out;
  // A client holding blocks while the endpoint is scraped.
  HeldBlocks held(d);
  // check_metrics.py wants touches and ticks counted: wait until the daemon has folded some.
  EXPECT_TRUE(WaitFor([&] {
    const auto st = StatusOf(d);
    return st.value("touches", uint64_t{0}) > 0 && st.value("ticks", uint64_t{0}) > 0;
  })) << StatusOf(d).dump();
  const std::string endpoint = StatusOf(d)["metrics_endpoint"];
  ASSERT_FALSE(endpoint.empty()) << d.Log();
  const testing::ShellResult r =
      testing::Shell("/usr/bin/python3 " CXLTIER_TEST_SOURCE "/integration/check_metrics.py " +
                     endpoint + " --per-uid 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("0 checks failed"), std::string::npos) << r.out;
}

// The operator's commands against a live daemon: top, config show, policy set, reload.
TEST(Daemon, CxltierctlTopConfigPolicyReload) {
  DaemonProcess d;
  HeldBlocks held(d);
  held.client->Observe(held.slots[0], 1.0f);
  WaitTicks(*held.client, 2);
  const std::string ctl = std::string(CXLTIERCTL_PATH) + " --socket " + d.socket() + " ";
  testing::ShellResult r = testing::Shell(ctl + "top --iterations 2 --interval 0.2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  int frames = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    EXPECT_EQ(j["status"]["blocks"], 2);
    EXPECT_GE(j["hottest"].size(), 2u);
    EXPECT_TRUE(j.contains("promoted_bytes_per_s"));
    ++frames;
  }
  EXPECT_EQ(frames, 2);
  r = testing::Shell(ctl + "top --iterations 1");  // the terminal view
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("hottest blocks"), std::string::npos) << r.out;
  r = testing::Shell(ctl + "config show");
  EXPECT_NE(r.out.find("[engine]"), std::string::npos) << r.out;
  // The default (shards) says which candidate leads: its first, before any
  // switch (two blocks are far from its warm-up).
  auto st = StatusOf(d);
  EXPECT_EQ(st["shards"]["leader"], "arc") << st.dump();
  EXPECT_EQ(st["shards"]["switches"], 0);
  EXPECT_TRUE(st["shards"]["sampled_touches"].is_number_unsigned()) << st.dump();
  EXPECT_GT(st["shards"]["rate"].get<double>(), 0.0);
  r = testing::Shell(ctl + "status");
  EXPECT_NE(r.out.find("shards: leader arc, 0 switches"), std::string::npos) << r.out;
  r = testing::Shell(ctl + "policy set ema:0.5");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(StatusOf(d)["policy"], "ema:0.5");
  EXPECT_TRUE(StatusOf(d)["shards"].is_null());
  r = testing::Shell(ctl + "policy set bogus 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("bogus"), std::string::npos) << r.out;
  r = testing::Shell(ctl + "reload --json");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(StatusOf(d)["policy"], std::string(engine::kDefaultPolicy));  // the file's (default)
}

TEST(Daemon, VerificationAsksTheKernel) {
  // The pages of every block the daemon moved are where the kernel says; with
  // both tiers on node 0, that is node 0 for all of them.
  DaemonProcess d("[engine]\ntier0_budget = \"16KiB\"\n");
  MemfdPool pool(8);
  auto a = Connect(d);
  uint32_t pid = 0;
  ASSERT_TRUE(a->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &pid).ok());
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < 8; ++i) entries.push_back({K(100 + i), i});
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(a->Admit(pid, entries, &res).ok());
  for (int round = 0; round < 10; ++round) {
    a->Observe(res[round % 8].slot, 1.0f);
    WaitTicks(*a, 1);
  }
  // The demotions run on the daemon's mover thread: wait for them.
  size_t slow = 0;
  WaitFor([&] {
    slow = 0;
    for (const auto& r : res) slow += a->TierOf(r.slot) == Tier::kSlow;
    return slow >= 6;
  });
  EXPECT_GE(slow, 6u) << "a 16 KiB tier 0 holds two 8 KiB blocks";
  auto m = numa::MakeLinuxMigrator();
  for (int node :
       m->Where(numa::PageRange{0, reinterpret_cast<uintptr_t>(pool.base), pool.bytes, true})) {
    EXPECT_EQ(node, 0);
  }
  for (uint64_t i = 0; i < pool.bytes; ++i) ASSERT_EQ(pool.base[i], static_cast<uint8_t>(i * 13));
}

// The policy mode at `address` of this process (get_mempolicy with
// MPOL_F_ADDR), and the lowest node of its mask, as "mode node"; or why not.
std::string PolicyAt(const void* address) {
  int mode = -1;
  unsigned long mask[16] = {};
  if (get_mempolicy(&mode, mask, 1024, const_cast<void*>(address), MPOL_F_ADDR) != 0) {
    return std::string("get_mempolicy: ") + std::strerror(errno);
  }
  for (int n = 0; n < 1024; ++n) {
    if (mask[n / 64] & (1ul << (n % 64))) return std::to_string(mode) + " " + std::to_string(n);
  }
  return std::to_string(mode) + " -";
}

// Tier 0's budget holds from admission (issue 32): a pool's new pages are
// steered to the last tier (here node 0, as both tiers are), a memfd's by the
// daemon through its own mapping and an address range's by the client
// library from the daemon's answer. Without it they land where first touched.
TEST(Daemon, APoolsNewPagesAreSteeredToTheLastTier) {
  DaemonProcess d("[engine]\ntier0_budget = \"16KiB\"\n");
  auto a = Connect(d);
  const std::string preferred_0 = std::to_string(MPOL_PREFERRED) + " 0";
  MemfdPool pool(8);
  uint32_t id = 0;
  EXPECT_EQ(PolicyAt(pool.base), std::to_string(MPOL_DEFAULT) + " -");
  ASSERT_TRUE(a->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &id).ok());
  EXPECT_EQ(PolicyAt(pool.base), preferred_0) << "memfd pool\n" << d.Log();
  const size_t bytes = 8 * kBlock;
  void* range = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  EXPECT_EQ(PolicyAt(range), std::to_string(MPOL_DEFAULT) + " -");
  const Status st = a->RegisterRangePool(range, bytes, kBlock, 8, &id);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(PolicyAt(range), preferred_0) << "address range pool\n" << d.Log();
  EXPECT_EQ(PolicyAt(static_cast<char*>(range) + bytes - 1), preferred_0);
  munmap(range, bytes);
}

// A block admitted before its pages exist is placed by the engine: in tier
// 0 while that has room under its budget, then in the last tier, its range
// steered there (a memfd's by the daemon, an address range's by the client
// library). One written before its admission is admitted where its pages
// are: here node 0, which both tiers have, counted in the last tier, where
// the pool's new pages go. Tier 0 never holds more than its 4 blocks. A
// block released from tier 0 leaves its pages there: they stay counted in
// tier 0 until moved down (the next plans' first moves) or until a block is
// admitted on them, which takes their place; a new block finds no room
// meanwhile. No tick in the test's time: no planned move changes a tier
// under it, and nothing moves the released pages down.
TEST(Daemon, BlocksAdmittedBeforeTheirPagesAreWrittenUseTier0WithinItsBudget) {
  DaemonProcess d("[engine]\ntier0_budget = \"32KiB\"\n", "", "tick_ms = 60000\n");
  auto tier0_blocks = [&] { return StatusOf(d)["tiers"][0]["blocks"].get<uint64_t>(); };
  auto held = [&] {
    return StatusOf(d)["migrations"]["released_pages"]["held_blocks"].get<uint64_t>();
  };
  for (const bool memfd : {true, false}) {
    SCOPED_TRACE(memfd ? "memfd pool" : "address range pool");
    auto a = Connect(d);  // its released blocks' pages are forgotten when it leaves
    MemfdPool file(8, false);
    uint8_t* base = file.base;
    uint32_t id = 0;
    if (memfd) {
      ASSERT_TRUE(a->RegisterMemfdPool(file.fd, file.bytes, kBlock, 8, &id).ok());
    } else {
      base = static_cast<uint8_t*>(
          mmap(nullptr, file.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      ASSERT_NE(base, MAP_FAILED);
      const Status st = a->RegisterRangePool(base, file.bytes, kBlock, 8, &id);
      ASSERT_TRUE(st.ok()) << st.message;
    }
    const uint64_t k0 = memfd ? 0 : 100;
    std::memset(base, 1, kBlock);  // block 0: written, then admitted
    std::vector<wire::AdmitResult> res;
    ASSERT_TRUE(a->Admit(id, std::vector<wire::AdmitEntry>{{K(k0), 0}}, &res).ok());
    EXPECT_EQ(res.at(0).tier, Tier::kSlow);
    std::vector<wire::AdmitEntry> fresh;
    for (uint32_t b = 1; b <= 6; ++b) fresh.push_back({K(k0 + b), b});
    ASSERT_TRUE(a->Admit(id, fresh, &res).ok());
    ASSERT_EQ(res.size(), 6u);
    for (size_t i = 0; i < res.size(); ++i) {
      EXPECT_EQ(res[i].tier, i < 4 ? Tier::kFast : Tier::kSlow) << "block " << i + 1 << "\n"
                                                                << d.Log();
    }
    for (uint32_t b = 1; b <= 6; ++b) std::memset(base + b * kBlock, 2, kBlock);
    EXPECT_EQ(tier0_blocks(), 4u);
    EXPECT_EQ(held(), 0u);
    // Released: tier 0's 4 blocks left their pages there, still counted.
    std::vector<BlockKey> keys{K(k0)};
    for (const wire::AdmitEntry& e : fresh) keys.push_back(e.key);
    ASSERT_TRUE(a->Release(keys).ok());
    EXPECT_EQ(tier0_blocks(), 0u);
    EXPECT_EQ(held(), 4u) << d.Log();
    ASSERT_TRUE(a->Admit(id, std::vector<wire::AdmitEntry>{{K(k0 + 7), 7}}, &res).ok());
    EXPECT_EQ(res.at(0).tier, Tier::kSlow) << "a new block found room beside the held pages";
    // Blocks admitted on those pages take their place (found on node 0,
    // which here is the last tier's too).
    std::vector<wire::AdmitEntry> reused;
    for (uint32_t b = 1; b <= 4; ++b) reused.push_back({K(k0 + 10 + b), b});
    ASSERT_TRUE(a->Admit(id, reused, &res).ok());
    EXPECT_EQ(held(), 0u);
    // Block 7 has no page yet: released from the last tier, admitted again,
    // it finds tier 0's room.
    ASSERT_TRUE(a->Release(std::vector<BlockKey>{K(k0 + 7)}).ok());
    ASSERT_TRUE(a->Admit(id, std::vector<wire::AdmitEntry>{{K(k0 + 8), 7}}, &res).ok());
    EXPECT_EQ(res.at(0).tier, Tier::kFast);
    EXPECT_EQ(tier0_blocks(), 1u);
    a.reset();  // its blocks go (keeping their places: nothing held)
    ASSERT_TRUE(WaitFor([&] { return tier0_blocks() == 0 && held() == 0; })) << d.Log();
    if (!memfd) munmap(base, file.bytes);
  }
}

// ---- hostile input ----

int RawConnect(const std::string& path) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path.c_str());
  EXPECT_EQ(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return s;
}

std::vector<uint8_t> Header(uint32_t magic, uint16_t version, uint16_t type, uint32_t len) {
  std::vector<uint8_t> h(16);
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &version, 2);
  std::memcpy(h.data() + 6, &type, 2);
  std::memcpy(h.data() + 8, &len, 4);
  return h;
}

// Reads one frame; returns the error it carries (code 0 if it is not an error).
wire::Error ReadError(int s) {
  uint8_t h[16];
  size_t got = 0;
  while (got < 16) {
    const ssize_t n = read(s, h + got, 16 - got);
    if (n <= 0) return wire::Error{static_cast<wire::ErrorCode>(0), "closed"};
    got += static_cast<size_t>(n);
  }
  const wire::Header hdr = *wire::DecodeHeader(h);
  std::vector<uint8_t> p(hdr.payload_bytes);
  got = 0;
  while (got < p.size()) {
    const ssize_t n = read(s, p.data() + got, p.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  wire::Error e{static_cast<wire::ErrorCode>(0), ""};
  if (hdr.type == wire::MsgType::kError) (void)wire::Decode(p, &e);
  return e;
}

bool ClosedByPeer(int s) {
  char c;
  return read(s, &c, 1) == 0;
}

// A client's segment shows the daemon's tick from its hello on: it showed 0
// until the next tick, so a client that counted ticks from its hello saw
// them jump by the daemon's age (a wait for 11 ticks ended at the first,
// and Daemon.BadInputGetsClearErrorsAndOthersKeepBeingServed folded two
// hostile writes as one under TSan). Fails without the hello's store unless
// a tick lands between the hello's answer and the read.
TEST(Daemon, ANewClientSeesTheDaemonsTickFromItsHello) {
  DaemonProcess d;
  auto first = Connect(d, "first");
  WaitTicks(*first, 3);
  const uint64_t before = first->daemon_ticks();
  EXPECT_GT(before, 0u);
  auto second = Connect(d, "second");
  EXPECT_GE(second->daemon_ticks(), before);
}

TEST(Daemon, BadInputGetsClearErrorsAndOthersKeepBeingServed) {
  DaemonProcess d;
  MemfdPool pool(8);
  auto good = Connect(d, "good");
  uint32_t pid = 0;
  ASSERT_TRUE(good->RegisterMemfdPool(pool.fd, pool.bytes, kBlock, 8, &pid).ok());
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(good->Admit(pid, std::vector<wire::AdmitEntry>{{K(1), 0}}, &res).ok());
  auto still_serving = [&] {
    std::string json;
    ASSERT_TRUE(good->Stats("status", &json).ok());
    ASSERT_TRUE(good->Admit(pid, std::vector<wire::AdmitEntry>{{K(1), 0}}, &res).ok());
    ASSERT_TRUE(d.Alive());
  };

  {  // garbage bytes
    const int s = RawConnect(d.socket());
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_GT(write(s, junk, sizeof(junk)), 0);
    EXPECT_EQ(ReadError(s).code, wire::ErrorCode::kBadFrame);
    EXPECT_TRUE(ClosedByPeer(s));
    close(s);
  }
  still_serving();
  {  // wrong protocol version
    const int s = RawConnect(d.socket());
    auto h = Header(wire::kMagic, 9, 13, 0);
    ASSERT_EQ(write(s, h.data(), h.size()), 16);
    const wire::Error e = ReadError(s);
    EXPECT_EQ(e.code, wire::ErrorCode::kBadVersion);
    EXPECT_NE(e.message.find("version 9"), std::string::npos);
    close(s);
  }
  {  // oversized frame
    const int s = RawConnect(d.socket());
    auto h = Header(wire::kMagic, wire::kVersion, 13, 1u << 30);
    ASSERT_EQ(write(s, h.data(), h.size()), 16);
    EXPECT_EQ(ReadError(s).code, wire::ErrorCode::kTooLarge);
    close(s);
  }
  {  // unknown message type: answered, and the connection goes on
    const int s = RawConnect(d.socket());
    auto h = Header(wire::kMagic, wire::kVersion, 999, 3);
    h.insert(h.end(), {1, 2, 3});
    std::vector<uint8_t> stats;
    wire::Encode(wire::Stats{"status"}, 5, stats);
    h.insert(h.end(), stats.begin(), stats.end());
    ASSERT_EQ(write(s, h.data(), h.size()), static_cast<ssize_t>(h.size()));
    EXPECT_EQ(ReadError(s).code, wire::ErrorCode::kUnknownType);
    EXPECT_EQ(static_cast<int>(ReadError(s).code), 0);  // the stats answer
    close(s);
  }
  {  // a reply type sent by a client, and a payload that does not parse
    const int s = RawConnect(d.socket());
    std::vector<uint8_t> f;
    wire::Encode(wire::ReleaseOk{1, 1}, 1, f);
    auto bad =
        Header(wire::kMagic, wire::kVersion, static_cast<uint16_t>(wire::MsgType::kAdmit), 2);
    bad.insert(bad.end(), {0, 0});
    f.insert(f.end(), bad.begin(), bad.end());
    ASSERT_EQ(write(s, f.data(), f.size()), static_cast<ssize_t>(f.size()));
    EXPECT_EQ(ReadError(s).code, wire::ErrorCode::kUnknownType);
    EXPECT_EQ(ReadError(s).code, wire::ErrorCode::kBadPayload);
    close(s);
  }
  {  // truncated frame, then hang up
    const int s = RawConnect(d.socket());
    auto h = Header(wire::kMagic, 1, static_cast<uint16_t>(wire::MsgType::kAdmit), 100);
    h.resize(26);
    ASSERT_EQ(write(s, h.data(), h.size()), 26);
    close(s);
  }
  still_serving();
  {  // pools: a regular file instead of a memfd, a memfd too small, bad geometry
    auto c = Connect(d, "pools");
    const std::string file = (d.dir() / "not-a-memfd").string();
    std::ofstream(file) << std::string(1 << 16, 'x');
    const int fd = open(file.c_str(), O_RDWR | O_CLOEXEC);
    uint32_t id;
    Status st = c->RegisterMemfdPool(fd, 1 << 16, kBlock, 8, &id);
    close(fd);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPool);
    EXPECT_NE(st.message.find("not a memfd"), std::string::npos) << st.message;
    MemfdPool small(2);
    st = c->RegisterMemfdPool(small.fd, small.bytes * 4, kBlock, 8, &id);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPool);
    EXPECT_NE(st.message.find("less than the pool's"), std::string::npos) << st.message;
    st = c->RegisterMemfdPool(small.fd, small.bytes, kBlock / 2, 2, &id);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPool);
    // Admit outside the pool, report to slots that do not exist.
    ASSERT_TRUE(c->RegisterMemfdPool(small.fd, small.bytes, kBlock, 2, &id).ok());
    st = c->Admit(id, std::vector<wire::AdmitEntry>{{K(50), 7}}, &res);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadSlot);
    wire::ReportOk ok;
    ASSERT_TRUE(c->Report(std::vector<wire::Observation>{{999999, 1.0f}, {0, 1.0f}}, &ok).ok());
    EXPECT_EQ(ok.rejected, 2u);  // slot 0 is not admitted either
    // A long list goes in parts of 65,536 (one frame of 200,000 would be
    // 1.6 MB, over the daemon's 1 MiB), and the answers are summed.
    const std::vector<wire::Observation> many(200000, wire::Observation{999999, 1.0f});
    ASSERT_TRUE(c->Report(many, &ok).ok());
    EXPECT_EQ(ok.rejected, 200000u);
    EXPECT_EQ(ok.accepted, 0u);
    ModelGeometry bad = kTiny8KiB;
    bad.kv_heads = 3;
    Status cs;
    EXPECT_FALSE(Client::Connect({d.socket(), bad, 4, "x"}, &cs));
    EXPECT_EQ(cs.code, wire::ErrorCode::kGeometry);
    ModelGeometry other = kTiny8KiB;
    other.layers = 2;  // 16 KiB blocks: not what this daemon places
    EXPECT_FALSE(Client::Connect({d.socket(), other, 4, "x"}, &cs));
    EXPECT_NE(cs.message.find("places blocks of 8192 bytes"), std::string::npos) << cs.message;
  }
  still_serving();
  {  // NaN, infinite, negative or absurd observations: refused by the library,
     // and a hostile client writing its totals directly is counted, never folded
    auto c = Connect(d, "nan");
    MemfdPool p(2);
    uint32_t id;
    ASSERT_TRUE(c->RegisterMemfdPool(p.fd, p.bytes, kBlock, 2, &id).ok());
    ASSERT_TRUE(c->Admit(id, std::vector<wire::AdmitEntry>{{K(60), 0}}, &res).ok());
    const uint32_t slot = res[0].slot;
    EXPECT_FALSE(c->Observe(slot, std::numeric_limits<float>::quiet_NaN()));
    EXPECT_FALSE(c->Observe(slot, std::numeric_limits<float>::infinity()));
    EXPECT_FALSE(c->Observe(slot, -5.0f));
    wire::ReportOk rok;
    ASSERT_TRUE(
        c->Report(std::vector<wire::Observation>{{slot, std::numeric_limits<float>::quiet_NaN()},
                                                 {slot, -1.0f}},
                  &rok)
            .ok());
    EXPECT_EQ(rok.rejected, 2u);
    // The client's count of bad observations, as status says.
    const auto bad = [&] {
      for (const auto& cl : StatusOf(d, "clients")) {
        if (cl["name"] == "nan") return cl["bad_observations"].get<uint64_t>();
      }
      return uint64_t{0};
    };
    EXPECT_EQ(bad(), 2u);  // the two rejected reports
    // These writes set no dirty bit: the daemon's full fold (every 10 ticks)
    // finds them, as it would totals whose dirty bit lost a race. Each is
    // waited for (bounded) before the next, so each is counted on its own.
    auto* raw = const_cast<BlockState*>(c->SlotState(slot));
    raw->client_mass_q16 += 12345;  // mass with no touch
    EXPECT_TRUE(WaitFor([&] { return bad() >= 3; })) << bad();
    raw->client_touches += 0x80000000u;  // two billion touches in one tick
    EXPECT_TRUE(WaitFor([&] { return bad() >= 4; })) << bad();
    raw->client_touches += 1;  // one touch carrying 65536 x 65535 units: more than the cap
    raw->client_mass_q16 += 0xfffffff0u;
    EXPECT_TRUE(WaitFor([&] { return bad() >= 5; })) << bad();
    WaitTicks(*c, 11);          // and nothing more is counted after
    EXPECT_EQ(bad(), 2u + 3u);  // two rejected reports, three hostile writes
    EXPECT_TRUE(std::isfinite(c->SlotState(slot)->score));
    // Only the last write was folded, as one touch carrying no mass.
    EXPECT_EQ(c->SlotState(slot)->touch_count, 1u);
  }
  still_serving();
  {  // a client killed with SIGKILL mid-batch: its pool is dropped, its states become ghosts
    const uint64_t ghosts_before = StatusOf(d)["ghosts"];
    const pid_t child = testing::ForkAlone();
    if (child == 0) {
      Status st;
      auto c = Client::Connect({d.socket(), kTiny8KiB, 64, "doomed"}, &st);
      MemfdPool p(32);
      uint32_t id = 0;
      if (!c || !c->RegisterMemfdPool(p.fd, p.bytes, kBlock, 32, &id).ok()) _exit(3);
      std::vector<wire::AdmitEntry> e;
      for (uint32_t i = 0; i < 32; ++i) e.push_back({BlockKey::FromSequence(999, i), i});
      std::vector<wire::AdmitResult> r;
      if (!c->Admit(id, e, &r).ok()) _exit(4);
      for (;;) {
        for (const auto& x : r) c->Observe(x.slot, 0.5f);
        c->Report(std::vector<wire::Observation>{{r[0].slot, 1.0f}});
      }
    }
    // Kill it once its 32 blocks are in (it loops over reports from then on).
    int child_status = 0;
    bool child_exited = false;
    const bool admitted = WaitFor([&] {
      child_exited = child_exited || waitpid(child, &child_status, WNOHANG) == child;
      return child_exited || StatusOf(d)["blocks"].get<uint64_t>() >= 33;
    });
    EXPECT_FALSE(child_exited) << "the doomed client exited on its own: " << child_status;
    EXPECT_TRUE(admitted) << "the doomed client's 32 blocks never showed up";
    kill(child, SIGKILL);
    if (!child_exited) waitpid(child, nullptr, 0);
    uint64_t ghosts = 0;
    WaitFor([&] {
      ghosts = StatusOf(d)["ghosts"];
      return ghosts >= ghosts_before + 32;
    });
    EXPECT_GE(ghosts, ghosts_before + 32);
  }
  still_serving();
  const std::string log = d.Log();
  EXPECT_NE(log.find("bad magic"), std::string::npos) << log;
}

TEST(Daemon, TooManyClientsIsAClearError) {
  // Root (this test) has the admin reserve beyond max_clients: 2 + 1.
  DaemonProcess d("[limits]\nmax_clients = 2\nadmin_reserved_connections = 1\n");
  auto a = Connect(d, "a");
  auto b = Connect(d, "b");
  auto reserve = Connect(d, "reserve");
  Status st;
  EXPECT_FALSE(Client::Connect({d.socket(), kTiny8KiB, 4, "c"}, &st));
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit);
  EXPECT_NE(st.message.find("too many clients"), std::string::npos) << st.message;
}

TEST(Daemon, CAbiWorks) {
  DaemonProcess d;
  MemfdPool pool(4);
  cxltier_model m{1, 1, 1, 128, 2, 16};
  cxltier_client* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(cxltier_connect(d.socket().c_str(), &m, 16, "c-abi", &c, err, sizeof(err)), 0) << err;
  uint32_t pid = 0;
  ASSERT_EQ(cxltier_register_memfd_pool(c, pool.fd, pool.bytes, kBlock, 4, &pid), 0);
  cxltier_key keys[2] = {{5, 1}, {5, 2}};
  uint32_t blocks[2] = {0, 1}, slots[2] = {};
  ASSERT_EQ(cxltier_admit(c, pid, keys, blocks, 2, slots), 0) << cxltier_last_error(c);
  EXPECT_NE(slots[0], slots[1]);
  EXPECT_EQ(cxltier_observe(c, slots[0], 1.0f), 0);
  EXPECT_EQ(cxltier_observe(c, slots[0], -1.0f), -CXLTIER_E_BAD_SLOT);
  EXPECT_GE(cxltier_tier(c, slots[0]), 0);
  EXPECT_EQ(cxltier_tier(c, 99999), -1);
  uint32_t bad_blocks[1] = {77};
  EXPECT_EQ(cxltier_admit(c, pid, keys, bad_blocks, 1, slots), -CXLTIER_E_BAD_SLOT);
  EXPECT_NE(std::string(cxltier_last_error(c)).find("outside pool"), std::string::npos);
  // Slots by key (a C engine looks them up again after cxltier_reconnect).
  uint32_t slot = 0;
  EXPECT_EQ(cxltier_slot_of(c, keys[1], &slot), 0);
  EXPECT_EQ(slot, slots[1]);
  EXPECT_EQ(cxltier_slot_of(c, cxltier_key{5, 99}, &slot), -CXLTIER_E_BAD_SLOT);
  // No C++ exception crosses the ABI: a count no vector can hold is an error.
  EXPECT_EQ(cxltier_release(c, keys, SIZE_MAX / 8), -CXLTIER_E_TOO_LARGE);
  EXPECT_NE(std::string(cxltier_last_error(c)).find("too large"), std::string::npos)
      << cxltier_last_error(c);
  // Each thread its own last error.
  EXPECT_EQ(cxltier_release(c, keys, 0), 0);
  std::string other;
  std::thread([&] {
    EXPECT_EQ(cxltier_observe(c, 99999, 1.0f), -CXLTIER_E_BAD_SLOT);
    other = cxltier_last_error(c);
  }).join();
  EXPECT_NE(other.find("bad-slot"), std::string::npos) << other;
  EXPECT_EQ(std::string(cxltier_last_error(c)), "");
  EXPECT_EQ(cxltier_release(c, keys, 2), 0);
  cxltier_close(c);
  cxltier_client* none = nullptr;
  EXPECT_LT(cxltier_connect("/nonexistent.sock", &m, 4, "x", &none, err, sizeof(err)), 0);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(err).find("connect"), std::string::npos);
}

TEST(Aggregation, StreamsAndGqa) {
  std::vector<float> streams(kLlama3_70B.streams(), 0.5f);
  streams[3] = 2.0f;
  streams[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FLOAT_EQ(AggregateStreams(kLlama3_70B, streams, Reduce::kMax), 2.0f);
  EXPECT_FLOAT_EQ(AggregateStreams(kLlama3_70B, streams, Reduce::kSum), 0.5f * 638 + 2.0f);
  EXPECT_FLOAT_EQ(AggregateStreams(kLlama3_70B, streams, Reduce::kMean), (0.5f * 638 + 2.0f) / 639);
  EXPECT_EQ(AggregateStreams(kLlama3_70B, std::vector<float>(10, 1.0f), Reduce::kSum), 0.0f);
  EXPECT_EQ(KvHeadOfQueryHead(kLlama3_70B, 0), 0u);
  EXPECT_EQ(KvHeadOfQueryHead(kLlama3_70B, 7), 0u);
  EXPECT_EQ(KvHeadOfQueryHead(kLlama3_70B, 8), 1u);
  EXPECT_EQ(KvHeadOfQueryHead(kLlama3_70B, 63), 7u);
  std::vector<float> q(80 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 64);
  std::vector<float> out(640);
  ASSERT_TRUE(QueryHeadsToStreams(kLlama3_70B, q, out, Reduce::kMax));
  EXPECT_FLOAT_EQ(out[0], 7.0f);   // layer 0, KV head 0: query heads 0..7
  EXPECT_FLOAT_EQ(out[7], 63.0f);  // layer 0, KV head 7: query heads 56..63
  EXPECT_FLOAT_EQ(out[8], 7.0f);   // layer 1, KV head 0
  ASSERT_TRUE(QueryHeadsToStreams(kLlama3_70B, q, out, Reduce::kMean));
  EXPECT_FLOAT_EQ(out[1], 11.5f);  // mean of 8..15
  EXPECT_FALSE(QueryHeadsToStreams(kLlama3_70B, std::vector<float>(5), out, Reduce::kSum));
}

}  // namespace
}  // namespace cxltier
