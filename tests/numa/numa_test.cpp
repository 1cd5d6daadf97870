// Topology discovery and real page migration on this machine's nodes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

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
  EXPECT_EQ(res.on_target, res.pages);
  for (int node : m->Where(r)) EXPECT_EQ(node, 0);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(static_cast<uint8_t*>(p)[i], 0x5a);
  munmap(p, kBytes);
}

TEST(Migrator, SharedMemfdPagesOfAnotherProcess) {
  // A memfd mapped by this process and by a child; the child's pages are moved
  // by pid (as the daemon does for range pools) and ours with MOVE_ALL.
  const int fd = memfd_create("cxltier-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  for (size_t i = 0; i < kBytes; ++i) p[i] = static_cast<uint8_t>(i * 7);
  auto m = MakeLinuxMigrator();
  const PageRange r{0, reinterpret_cast<uintptr_t>(p), kBytes, true};
  const MoveResult res = m->Move(r, 0);
  EXPECT_TRUE(res.done()) << Summarize(res);
  EXPECT_EQ(res.on_target, kBytes / 4096);
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
  EXPECT_EQ(res.on_target, 1u);
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

}  // namespace
}  // namespace cxltier::numa
