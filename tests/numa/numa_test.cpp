// Topology discovery and real page migration on this machine's nodes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
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
  Result<TierAssignment> r = AssignTiers(t, {}, {});
  ASSERT_TRUE(r.ok()) << r.status().message;
  TierAssignment a = *r;
  EXPECT_EQ(a.fast_nodes, std::vector<int>{0});
  EXPECT_EQ(a.slow_nodes, std::vector<int>{1});
  const std::string d = Describe(t, a);
  EXPECT_NE(d.find("node 1: 1024 MiB, 0 CPUs, tier 1, read latency 300 ns"), std::string::npos)
      << d;
  r = AssignTiers(t, {0}, {0});
  ASSERT_TRUE(r.ok()) << r.status().message;
  a = *r;
  EXPECT_TRUE(a.has_slow());
  EXPECT_NE(Describe(t, a).find("tier 0+1"), std::string::npos);
  r = AssignTiers(t, {0}, {7});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code, wire::ErrorCode::kBadPayload);
  EXPECT_NE(r.status().message.find("slow node 7 does not exist"), std::string::npos);
  Topology one;
  one.nodes = {NumaNode{0, 1 << 30, {0}, {}, {}, {}}};
  EXPECT_FALSE(AssignTiers(one, {}, {})->has_slow());
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

// A fake sysfs tree in a temporary directory, removed at the end.
class FakeSysfs {
 public:
  FakeSysfs() {
    char dir[] = "/tmp/cxltier-sysfs-XXXXXX";
    if (mkdtemp(dir)) root_ = dir;
  }
  ~FakeSysfs() {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }
  const std::string& root() const { return root_; }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path file = std::filesystem::path(root_) / path;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  }
  // A node: its CPUs ("" for none), MiB, and HMAT latency/bandwidth (0: none).
  void Node(int id, const std::string& cpus, uint64_t mib, uint64_t latency_ns = 0,
            uint64_t bandwidth_mib_s = 0) {
    const std::string dir = "devices/system/node/node" + std::to_string(id);
    Write(dir + "/cpulist", cpus);
    Write(dir + "/meminfo", "Node " + std::to_string(id) +
                                " MemTotal:  " + std::to_string(mib << 10) + " kB\nNode " +
                                std::to_string(id) + " MemFree:   1024 kB");
    if (latency_ns) Write(dir + "/access0/initiators/read_latency", std::to_string(latency_ns));
    if (bandwidth_mib_s) {
      Write(dir + "/access0/initiators/read_bandwidth", std::to_string(bandwidth_mib_s));
    }
  }
  void KernelTier(int tier, const std::string& nodelist) {
    Write("devices/virtual/memory_tiering/memory_tier" + std::to_string(tier) + "/nodelist",
          nodelist);
  }

 private:
  std::string root_;
};

std::vector<std::vector<int>> TiersOf(const TierAssignment& a) {
  std::vector<std::vector<int>> out;
  for (size_t k = 0; k < a.count(); ++k) out.push_back(a.Nodes(k));
  return out;
}

using Tiers = std::vector<std::vector<int>>;

std::vector<std::vector<int>> AutoTiers(const std::string& root) {
  const Result<TierAssignment> a = AssignTiers(DiscoverSysfs(root), Tiers{});
  EXPECT_TRUE(a.ok()) << a.status().message;
  return a.ok() ? TiersOf(*a) : Tiers{};
}

TEST(TopologySysfs, ReadsNodesHmatDistancesAndKernelTiers) {
  FakeSysfs fs;
  fs.Node(0, "0-1", 1024, 10, 20480);
  fs.Node(1, "", 512, 150, 10240);
  fs.Node(2, "", 512);
  fs.Write("devices/system/node/node0/distance", "10 20 30");
  fs.Write("devices/system/node/node1/distance", "20 10 30");
  fs.Write("devices/system/node/node2/distance", "30 30 10");
  fs.Write("devices/system/node/possible", "0-2");  // not a node directory
  fs.KernelTier(4, "0-1");
  fs.KernelTier(22, "2");
  const Topology t = DiscoverSysfs(fs.root());
  EXPECT_EQ(t.source, "sysfs");
  ASSERT_EQ(t.nodes.size(), 3u);
  EXPECT_EQ(t.nodes[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.nodes[0].memory_bytes, 1024ull << 20);
  EXPECT_TRUE(t.nodes[1].cpus.empty());
  EXPECT_EQ(t.nodes[1].read_latency_ns, 150u);
  EXPECT_EQ(t.nodes[1].read_bandwidth_mib_s, 10240u);
  EXPECT_FALSE(t.nodes[2].read_latency_ns.has_value());
  EXPECT_EQ(t.nodes[1].kernel_memory_tier, 4);
  EXPECT_EQ(t.nodes[2].kernel_memory_tier, 22);
  EXPECT_EQ(t.distances[0][2], 30);
  EXPECT_EQ(t.distances[1][1], 10);
  EXPECT_TRUE(DiscoverSysfs(fs.root() + "/nothing").nodes.empty());
}

// The three-node guest: CPUs on node 0, node 1 CPU-less at 150 ns in the
// DRAM kernel tier, a kmem-onlined CXL node (no HMAT) in a lower kernel tier.
TEST(TopologySysfs, ThreeNodesOrderedByKernelTierThenHmat) {
  FakeSysfs fs;
  fs.Node(0, "0-1", 1024, 10, 20480);
  fs.Node(1, "", 512, 150, 10240);
  fs.Node(2, "", 512);
  fs.KernelTier(4, "0-1");
  fs.KernelTier(22, "2");
  EXPECT_EQ(AutoTiers(fs.root()), (Tiers{{0}, {1}, {2}}));
  // The kernel's tiers win over HMAT: a node the kernel ranks lower comes later.
  FakeSysfs swapped;
  swapped.Node(0, "0-1", 1024);
  swapped.Node(1, "", 512, 100);
  swapped.Node(2, "", 512, 300);
  swapped.KernelTier(4, "0,2");
  swapped.KernelTier(22, "1");
  EXPECT_EQ(AutoTiers(swapped.root()), (Tiers{{0}, {2}, {1}}));
}

TEST(TopologySysfs, OneKernelTierSplitByHmatLatency) {
  FakeSysfs fs;
  fs.Node(0, "0-3", 1024, 10);
  fs.Node(1, "", 512, 300);
  fs.Node(2, "", 512, 150);
  fs.Node(3, "", 512, 200);  // within 1.5 x 150 ns: node 2's tier
  fs.Node(4, "", 512, 226);  // more than 1.5 x 150 ns
  fs.KernelTier(4, "0-4");
  EXPECT_EQ(AutoTiers(fs.root()), (Tiers{{0}, {2, 3}, {4, 1}}));
  // No kernel memory tiers (an older kernel): HMAT alone orders and splits.
  FakeSysfs old;
  old.Node(0, "0-1", 1024);
  old.Node(1, "", 512, 300);
  old.Node(2, "", 512, 150);
  EXPECT_EQ(AutoTiers(old.root()), (Tiers{{0}, {2}, {1}}));
}

TEST(TopologySysfs, NoHmatKeepsAKernelTierTogether) {
  FakeSysfs fs;  // today's hosts: one node with CPUs, one without, no HMAT
  fs.Node(0, "0-1", 1024);
  fs.Node(1, "", 1024);
  EXPECT_EQ(AutoTiers(fs.root()), (Tiers{{0}, {1}}));
  FakeSysfs two;
  two.Node(0, "0-1", 1024);
  two.Node(1, "", 512, 150);
  two.Node(2, "", 512);  // no HMAT: stays with node 1 in kernel tier 4
  two.Node(3, "", 512, 180, 500);
  two.Node(4, "", 512, 180, 900);  // same latency, more bandwidth: first
  two.KernelTier(4, "0-4");
  EXPECT_EQ(AutoTiers(two.root()), (Tiers{{0}, {1, 4, 3, 2}}));
  FakeSysfs one;
  one.Node(0, "0-1", 1024);
  EXPECT_FALSE(AssignTiers(DiscoverSysfs(one.root()), Tiers{})->has_slow());
  EXPECT_EQ(AssignTiers(DiscoverSysfs(one.root()), Tiers{})->count(), 1u);
}

TEST(TopologySysfs, NodesWithCpusAreTierZeroWhateverTheirKernelTier) {
  FakeSysfs fs;  // two sockets: both are tier 0, as before
  fs.Node(0, "0", 1024, 10);
  fs.Node(1, "1", 1024, 20);
  fs.Node(2, "", 1024);
  fs.KernelTier(4, "0-1");
  fs.KernelTier(22, "2");
  EXPECT_EQ(AutoTiers(fs.root()), (Tiers{{0, 1}, {2}}));
}

TEST(TopologySysfs, AtMostEightTiers) {
  FakeSysfs fs;
  fs.Node(0, "0", 1024);
  for (int n = 1; n <= 10; ++n) {
    fs.Node(n, "", 64);
    fs.KernelTier(4 + n, std::to_string(n));
  }
  const Tiers t = AutoTiers(fs.root());
  ASSERT_EQ(t.size(), kMaxDiscoveredTiers);
  EXPECT_EQ(t.back(), (std::vector<int>{7, 8, 9, 10}));
}

TEST(Topology, NTierOverride) {
  Topology t;
  t.nodes = {NumaNode{0, 1 << 30, {0}, {}, {}, {}}, NumaNode{1, 1 << 30, {}, {}, {}, {}},
             NumaNode{2, 1 << 30, {}, {}, {}, {}}};
  const Result<TierAssignment> r = AssignTiers(t, Tiers{{0}, {2}, {1}});
  ASSERT_TRUE(r.ok()) << r.status().message;
  const TierAssignment& a = *r;
  EXPECT_EQ(TiersOf(a), (Tiers{{0}, {2}, {1}}));
  EXPECT_EQ(a.why, "config override");
  EXPECT_EQ(a.TierOf(1), 2);
  EXPECT_EQ(a.TierOf(7), -1);
  EXPECT_NE(Describe(t, a).find("node 1: 1024 MiB, 0 CPUs, tier 2"), std::string::npos);
  const auto error_of = [&](const Tiers& tiers) {
    const Result<TierAssignment> bad = AssignTiers(t, tiers);
    return bad.ok() ? std::string("(accepted)") : bad.status().message;
  };
  EXPECT_EQ(error_of(Tiers{{0}, {1}, {5}}), "node 5 of tier 2 does not exist");
  EXPECT_EQ(error_of(Tiers{{0}, {}}), "tier 1 of the override has no node");
  EXPECT_EQ(error_of(Tiers{{0}}), "the tiers override needs at least two tiers");
  EXPECT_EQ(error_of(Tiers(9, std::vector<int>{0})), "the tiers override names 9 tiers; at most 8");
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
  auto opened = ProcessHandle::Open(getpid(), getuid());
  ASSERT_TRUE(opened.ok()) << opened.status().message;
  std::shared_ptr<const ProcessHandle> self = std::move(*opened);
  EXPECT_TRUE(self->Alive());
  EXPECT_EQ(self->Check(), 0);
  const auto other_uid = ProcessHandle::Open(getpid(), getuid() + 1);
  ASSERT_FALSE(other_uid.ok());
  EXPECT_EQ(other_uid.status().code, wire::ErrorCode::kBadPool);
  EXPECT_NE(other_uid.status().message.find("no longer runs as uid"), std::string::npos)
      << other_uid.status().message;
  EXPECT_FALSE(ProcessHandle::Open(0, getuid()).ok());
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
  auto opened = ProcessHandle::Open(child, getuid());
  ASSERT_TRUE(opened.ok()) << opened.status().message;
  std::shared_ptr<const ProcessHandle> handle = std::move(*opened);
  close(release);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: the pid is free for anyone
  EXPECT_FALSE(handle->Alive());
  EXPECT_EQ(handle->Check(), ESRCH);
  const auto gone = ProcessHandle::Open(child, getuid());
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message.find("has exited"), std::string::npos) << gone.status().message;

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
  auto opened = ProcessHandle::Open(getpid(), getuid());
  ASSERT_TRUE(opened.ok()) << opened.status().message;
  std::shared_ptr<const ProcessHandle> self = std::move(*opened);
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

// A memfd that shrank under the daemon's mapping (the daemon refuses
// unsealed pools; this is the migrator's own guard): the move faults nothing
// in past the end of the file, so no SIGBUS; the pages that are gone count
// absent, the ones left are moved.
TEST(Migrator, MoveOfAShrunkMemfdDoesNotFault) {
  const std::string out = InChild([]() -> std::string {
    const int fd = memfd_create("cxltier-shrunk", MFD_CLOEXEC);  // unsealed on purpose
    if (fd < 0 || ftruncate(fd, kBytes) != 0) return "memfd";
    auto* rw = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_WRITE, MAP_SHARED, fd, 0));
    if (rw == MAP_FAILED) return "mmap";
    std::memset(rw, 0x77, kBytes);
    munmap(rw, kBytes);
    auto mapped = Mapping::Map(fd, kBytes);
    if (!mapped.ok()) return mapped.status().message;
    std::shared_ptr<const Mapping> mapping = std::move(*mapped);
    auto m = MakeLinuxMigrator();
    std::string bad;
    const size_t pages = kBytes / 4096;
    for (off_t size : {off_t{kBytes / 2}, off_t{0}}) {
      if (ftruncate(fd, size) != 0) return "ftruncate";
      const PageRange r{0, mapping->address(), kBytes, true, nullptr, mapping};
      const MoveResult res = m->Move(r, 0);
      const size_t left = static_cast<size_t>(size) / 4096;
      if (res.call_errno != 0 || res.verified != left || res.absent != pages - left) {
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
    auto mapped = Mapping::Map(fd, kBytes);
    if (!mapped.ok()) return mapped.status().message;
    std::shared_ptr<const Mapping> mapping = std::move(*mapped);
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

TEST(SpreadPages, EvenlyFirstAndLastIncluded) {
  EXPECT_EQ(SpreadPages(512, 8), (std::vector<size_t>{0, 73, 146, 219, 292, 365, 438, 511}));
  EXPECT_EQ(SpreadPages(3, 8), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(SpreadPages(5, 1), (std::vector<size_t>{0}));
  EXPECT_TRUE(SpreadPages(0, 8).empty());
  EXPECT_TRUE(SpreadPages(8, 0).empty());
}

// What the daemon asks at admission: a memfd pool's block that the client
// wrote, seen through the daemon's own mapping, which never touched it.
// Sample faults in the sampled pages the file has (else every one reads "not
// present") and no other: a hole stays a hole and costs no memory.
TEST(Migrator, SampleSeesAMemfdsWrittenPagesAndLeavesItsHolesHoles) {
  constexpr size_t kPages = kBytes / 4096;
  const int fd = memfd_create("cxltier-sample", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  auto* client = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(client, MAP_FAILED);
  std::memset(client, 0x5a, kBytes / 2);  // the first half; the rest are holes
  auto mapped = Mapping::Map(fd, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message;
  struct stat before {};
  ASSERT_EQ(fstat(fd, &before), 0);
  const PageRange r{0, (*mapped)->address(), kBytes, true};
  const std::vector<size_t> at = SpreadPages(kPages, 8);
  const std::vector<int> nodes = MakeLinuxMigrator()->Sample(r, 8);
  ASSERT_EQ(nodes.size(), at.size());
  for (size_t k = 0; k < at.size(); ++k) {
    if (at[k] < kPages / 2) {
      EXPECT_GE(nodes[k], 0) << "written page " << at[k] << " not seen";
    } else {
      EXPECT_EQ(nodes[k], -ENOENT) << "page " << at[k] << " is a hole";
    }
  }
  struct stat after {};
  ASSERT_EQ(fstat(fd, &after), 0);
  EXPECT_EQ(after.st_blocks, before.st_blocks) << "Sample allocated a hole";
  munmap(client, kBytes);
  close(fd);
}

TEST(Mapping, StaysMappedWhileAQueuedRangeHoldsIt) {
  const int fd = memfd_create("cxltier-mapping", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  auto mapped = Mapping::Map(fd, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message;
  std::shared_ptr<const Mapping> mapping = std::move(*mapped);
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

// The memory policy at `address` of this process (get_mempolicy with
// MPOL_F_ADDR): "mode nodes", e.g. "1 0" for MPOL_PREFERRED on node 0.
std::string PolicyAt(uintptr_t address) {
  int mode = -1;
  unsigned long mask[16] = {};
  if (get_mempolicy(&mode, mask, 1024, reinterpret_cast<void*>(address), MPOL_F_ADDR) != 0) {
    return std::string("get_mempolicy: ") + std::strerror(errno);
  }
  std::string out = std::to_string(mode);
  for (int n = 0; n < 1024; ++n) {
    if (mask[n / 64] >> (n % 64) & 1) out += " " + std::to_string(n);
  }
  return out;
}

// PreferNodes sets the file's shared policy through the daemon's read-only
// mapping: the client's own mapping of the same memfd (another mapping, at
// another address, from another offset) reads the same policy, and a page it
// faults in afterwards lands on the node.
TEST(PreferNodes, SetsTheMemfdsSharedPolicySeenByEveryMapping) {
  const int fd = memfd_create("cxltier-prefer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  auto* client = static_cast<uint8_t*>(
      mmap(nullptr, kBytes - 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096));
  ASSERT_NE(client, MAP_FAILED);
  auto mapped = Mapping::Map(fd, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message;
  std::shared_ptr<const Mapping> daemon = std::move(*mapped);
  const uintptr_t c = reinterpret_cast<uintptr_t>(client);
  ASSERT_EQ(PolicyAt(c), std::to_string(MPOL_DEFAULT)) << "a new memfd has no policy";

  const Status st = PreferNodes(*daemon, {0});
  ASSERT_TRUE(st.ok()) << st.message;
  const std::string preferred0 = std::to_string(MPOL_PREFERRED) + " 0";
  EXPECT_EQ(PolicyAt(daemon->address()), preferred0);
  EXPECT_EQ(PolicyAt(daemon->address() + kBytes - 4096), preferred0);
  // The client's mapping starts a page into the file: its first byte is the
  // daemon's second page, its last the daemon's last.
  EXPECT_EQ(PolicyAt(c), preferred0);
  EXPECT_EQ(PolicyAt(c + kBytes - 2 * 4096), preferred0);
  // A third mapping made after the call follows it too: the policy is the file's.
  void* late = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(late, MAP_FAILED);
  EXPECT_EQ(PolicyAt(reinterpret_cast<uintptr_t>(late)), preferred0);
  munmap(late, kBytes);
  // And a page the client faults in now is on the node.
  std::memset(client, 0x5a, 4096);
  void* page = client;
  int status = -1;
  ASSERT_EQ(numa_move_pages(0, 1, &page, nullptr, &status, 0), 0);
  EXPECT_EQ(status, 0);

  // Several nodes: MPOL_PREFERRED_MANY where the kernel has it (5.15), else
  // MPOL_PREFERRED on the first.
  ASSERT_TRUE(PreferNodes(*daemon, {0, 0}).ok());
  const std::string many = PolicyAt(c);
  EXPECT_TRUE(many == "5 0" || many == preferred0) << many;

  EXPECT_FALSE(PreferNodes(*daemon, {}).ok());
  const Status bad = PreferNodes(*daemon, {4096});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message.find("out of range"), std::string::npos) << bad.message;
  munmap(client, kBytes - 4096);
  close(fd);
}

}  // namespace
}  // namespace cxltier::numa
