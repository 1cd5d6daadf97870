// Topology discovery and real page migration on this machine's nodes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <string>

#include "fork_alone.h"
#include "numa/migrator.h"
#include "numa/topology.h"

namespace cxltier::numa {
namespace {

TEST(Topology, DiscoversAtLeastOneNodeWithCpus) {
  const Topology t = Discover();
  ASSERT_FALSE(t.nodes.empty());
  EXPECT_EQ(t.source, "hwloc");
  bool cpus = false;
  for (const NumaNode& n : t.nodes) {
    cpus |= !n.cpus.empty();
    EXPECT_GT(n.memory_bytes, 0u) << n.id;
  }
  EXPECT_TRUE(cpus);
  ASSERT_EQ(t.distances.size(), t.nodes.size());
  EXPECT_EQ(t.distances[0][0], 10);
}

TEST(Topology, AutoTiersAndOverride) {
  Topology t;
  t.nodes = {NumaNode{0, 1 << 30, {0, 1}, {}, {}, {}}, NumaNode{1, 1 << 30, {}, 300, 1000, 4}};
  std::string err;
  TierAssignment a = AssignTiers(t, {}, {}, &err);
  EXPECT_EQ(err, "");
  EXPECT_EQ(a.fast_nodes, std::vector<int>{0});
  EXPECT_EQ(a.slow_nodes, std::vector<int>{1});
  const std::string d = Describe(t, a);
  EXPECT_NE(d.find("node 1: 1024 MiB, 0 CPUs, tier 1, read latency 300 ns"), std::string::npos)
      << d;
  a = AssignTiers(t, {0}, {0}, &err);
  EXPECT_EQ(err, "");
  EXPECT_TRUE(a.has_slow());
  EXPECT_NE(Describe(t, a).find("tier 0+1"), std::string::npos);
  AssignTiers(t, {0}, {7}, &err);
  EXPECT_NE(err.find("slow node 7 does not exist"), std::string::npos);
  Topology one;
  one.nodes = {NumaNode{0, 1 << 30, {0}, {}, {}, {}}};
  EXPECT_FALSE(AssignTiers(one, {}, {}, &err).has_slow());
}

TEST(Topology, ReadsKernelMemoryTiers) {
  char dir[] = "/tmp/cxltier-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/devices/virtual/memory_tiering/memory_tier4";
  ASSERT_EQ(system(("mkdir -p " + base + " && echo 0 > " + base + "/nodelist").c_str()), 0);
  const Topology t = Discover(dir);
  ASSERT_TRUE(t.nodes[0].kernel_memory_tier.has_value());
  EXPECT_EQ(*t.nodes[0].kernel_memory_tier, 4);
  system((std::string("rm -rf ") + dir).c_str());
}

constexpr size_t kBytes = 4 << 20;

TEST(Migrator, MovesAndVerifiesOwnAnonymousPages) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, kBytes);
  auto m = MakeLinuxMigrator();
  const PageRange r{0, reinterpret_cast<uintptr_t>(p), kBytes, false};
  const MoveResult res = m->Move(r, 0);
  EXPECT_TRUE(res.done()) << Summarize(res);
  EXPECT_EQ(res.pages, kBytes / 4096);
  EXPECT_EQ(res.verified, res.pages);
  for (int node : m->Where(r)) EXPECT_EQ(node, 0);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(static_cast<uint8_t*>(p)[i], 0x5a);
  munmap(p, kBytes);
}

TEST(Migrator, SharedMemfdPagesOfAnotherProcess) {
  // A memfd mapped by this process and by a child; the child's pages are moved
  // by pid (as the daemon does for range pools) and ours with MOVE_ALL.
  const int fd = memfd_create("cxltier-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  for (size_t i = 0; i < kBytes; ++i) p[i] = static_cast<uint8_t>(i * 7);
  auto m = MakeLinuxMigrator();
  const PageRange r{0, reinterpret_cast<uintptr_t>(p), kBytes, true};
  const MoveResult res = m->Move(r, 0);
  EXPECT_TRUE(res.done()) << Summarize(res);
  EXPECT_EQ(res.verified, kBytes / 4096);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(p[i], static_cast<uint8_t>(i * 7));
  munmap(p, kBytes);
  close(fd);
}

TEST(Migrator, AbsentPagesAreReportedNotMoved) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  static_cast<uint8_t*>(p)[0] = 1;  // one page present
  auto m = MakeLinuxMigrator();
  const MoveResult res = m->Move(PageRange{0, reinterpret_cast<uintptr_t>(p), kBytes, false}, 0);
  EXPECT_EQ(res.verified, 1u);
  EXPECT_EQ(res.absent, res.pages - 1);
  EXPECT_TRUE(res.done());
  munmap(p, kBytes);
}

TEST(Migrator, BadPidIsACallError) {
  auto m = MakeLinuxMigrator();
  const MoveResult res = m->Move(PageRange{999999, 0x100000, 8192, false}, 0);
  EXPECT_NE(res.call_errno, 0);
  EXPECT_FALSE(res.done());
  EXPECT_NE(Summarize(res).find("move_pages failed"), std::string::npos);
}

TEST(ProcessHandle, PinsALiveProcessOfTheGivenUidOnly) {
  std::string err;
  auto self = ProcessHandle::Open(getpid(), getuid(), &err);
  ASSERT_NE(self, nullptr) << err;
  EXPECT_TRUE(self->Alive());
  EXPECT_EQ(self->Check(), 0);
  EXPECT_EQ(ProcessHandle::Open(getpid(), getuid() + 1, &err), nullptr);
  EXPECT_NE(err.find("no longer runs as uid"), std::string::npos) << err;
  EXPECT_EQ(ProcessHandle::Open(0, getuid(), &err), nullptr);
}

// A child that maps nothing of its own and waits for its stdin pipe to close.
pid_t WaitingChild(int* release_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = cxltier::testing::ForkAlone();
  if (pid == 0) {
    close(fds[1]);
    char c;
    while (read(fds[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  close(fds[0]);
  *release_fd = fds[1];
  return pid;
}

TEST(Migrator, RangeOfAProcessThatExitedFailsWithEsrchAndNeverNamesItsPid) {
  int release = -1;
  const pid_t child = WaitingChild(&release);
  ASSERT_GT(child, 0);
  std::string err;
  auto handle = ProcessHandle::Open(child, getuid(), &err);
  ASSERT_NE(handle, nullptr) << err;
  close(release);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: the pid is free for anyone
  EXPECT_FALSE(handle->Alive());
  EXPECT_EQ(handle->Check(), ESRCH);
  EXPECT_EQ(ProcessHandle::Open(child, getuid(), &err), nullptr);
  EXPECT_NE(err.find("has exited"), std::string::npos) << err;

  // The pid reused by another process (here: this one, with real pages at the
  // address): a move that trusted the pid would move them and report done.
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, kBytes);
  auto m = MakeLinuxMigrator();
  const PageRange reused{getpid(), reinterpret_cast<uintptr_t>(p), kBytes, false, handle};
  const MoveResult res = m->Move(reused, 0);
  EXPECT_FALSE(res.done());
  EXPECT_EQ(res.call_errno, ESRCH);
  EXPECT_STREQ(res.call, "process");
  EXPECT_EQ(res.verified, 0u);
  EXPECT_NE(Summarize(res).find("the pool's process has exited"), std::string::npos)
      << Summarize(res);
  for (int node : m->Where(reused)) ASSERT_EQ(node, -ESRCH);
  munmap(p, kBytes);
}

TEST(Migrator, RangeOfALiveProcessMovesThroughItsHandle) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x33, kBytes);
  std::string err;
  auto self = ProcessHandle::Open(getpid(), getuid(), &err);
  ASSERT_NE(self, nullptr) << err;
  auto m = MakeLinuxMigrator();
  const MoveResult res =
      m->Move(PageRange{getpid(), reinterpret_cast<uintptr_t>(p), kBytes, false, self}, 0);
  EXPECT_TRUE(res.done()) << Summarize(res);
  EXPECT_EQ(res.verified, kBytes / 4096);
  munmap(p, kBytes);
}

// Runs `fn` in a child: a fault on client memory kills the child, not the
// test, and shows up as the signal that killed it.
std::string InChild(const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe";
  const pid_t pid = cxltier::testing::ForkAlone();
  if (pid == 0) {
    close(fds[0]);
    const std::string out = fn();
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return out + "child killed by " + strsignal(WTERMSIG(status));
  return out;
}

TEST(Migrator, MoveOfAShrunkMemfdFailsInsteadOfFaulting) {
  const std::string out = InChild([]() -> std::string {
    const int fd = memfd_create("cxltier-shrunk", MFD_CLOEXEC);  // unsealed on purpose
    if (fd < 0 || ftruncate(fd, kBytes) != 0) return "memfd";
    auto* rw = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_WRITE, MAP_SHARED, fd, 0));
    if (rw == MAP_FAILED) return "mmap";
    std::memset(rw, 0x77, kBytes);
    munmap(rw, kBytes);
    std::string err;
    auto mapping = Mapping::Map(fd, kBytes, &err);
    if (!mapping) return err;
    auto m = MakeLinuxMigrator();
    std::string bad;
    for (off_t size : {off_t{kBytes / 2}, off_t{0}}) {
      if (ftruncate(fd, size) != 0) return "ftruncate";
      const PageRange r{0, mapping->address(), kBytes, true, nullptr, mapping};
      const MoveResult res = m->Move(r, 0);
      if (res.done() || res.call_errno != EFAULT || std::string(res.call) != "populate") {
        bad += "shrunk to " + std::to_string(size) + ": " + Summarize(res) + "; ";
      }
      (void)m->Where(r);  // asks the kernel only
    }
    close(fd);
    return bad;
  });
  EXPECT_EQ(out, "");
}

TEST(Migrator, HolesInASealedMemfdDoNotFault) {
  const std::string out = InChild([]() -> std::string {
    const int fd = memfd_create("cxltier-holes", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, kBytes) != 0) return "memfd";
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return "seal";
    if (ftruncate(fd, 0) == 0 || errno != EPERM) return "a sealed memfd shrank";
    auto* rw = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_WRITE, MAP_SHARED, fd, 0));
    if (rw == MAP_FAILED) return "mmap";
    std::memset(rw, 0x77, kBytes);
    munmap(rw, kBytes);
    std::string err;
    auto mapping = Mapping::Map(fd, kBytes, &err);
    if (!mapping) return err;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, kBytes / 2) != 0) {
      return "punch";
    }
    auto m = MakeLinuxMigrator();
    const MoveResult res =
        m->Move(PageRange{0, mapping->address(), kBytes, true, nullptr, mapping}, 0);
    close(fd);
    return res.call_errno == 0 ? "" : "move failed: " + Summarize(res);
  });
  EXPECT_EQ(out, "");
}

TEST(Mapping, StaysMappedWhileAQueuedRangeHoldsIt) {
  const int fd = memfd_create("cxltier-mapping", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  std::string err;
  auto mapping = Mapping::Map(fd, kBytes, &err);
  ASSERT_NE(mapping, nullptr) << err;
  close(fd);  // the mapping holds the file
  const uintptr_t address = mapping->address();
  PageRange queued{0, address, kBytes, true, nullptr, mapping};
  mapping.reset();  // the pool is gone (its client disconnected)
  EXPECT_EQ(msync(reinterpret_cast<void*>(address), kBytes, MS_ASYNC), 0) << "unmapped early";
  auto m = MakeLinuxMigrator();
  const MoveResult res = m->Move(queued, 0);
  EXPECT_TRUE(res.done()) << Summarize(res);
  queued = PageRange{};  // the move is done and dropped: now it goes
  EXPECT_EQ(msync(reinterpret_cast<void*>(address), kBytes, MS_ASYNC), -1);
  EXPECT_EQ(errno, ENOMEM);
}

}  // namespace
}  // namespace cxltier::numa
