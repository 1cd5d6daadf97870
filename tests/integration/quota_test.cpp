// Quotas with real users (issue 18): two uids contend for a small tier 0.
// User A has a tier-0 cap: A never holds more than it (in status, and in the
// kernel's page placement where the two tiers are different nodes) and B's
// blocks are not displaced by A's misses beyond it. Then, through the real
// socket as root, B gets a guarantee and A loses its cap: B keeps its
// guarantee while A's hot traffic contends, and loses it once the guarantee
// goes. A non-admin uid's quota request is refused, and its status shows only
// its own share. A reload brings the file's quotas back. Needs root (it
// creates the users; skipped otherwise).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <numaif.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "daemon_harness.h"
#include "models.h"
#include "run_as.h"
#include "shell.h"

namespace cxltier::testing {
namespace {

constexpr uint64_t kPage = 4096;   // pool stride: one page a block
constexpr uint32_t kBlocksA = 40;  // more than tier 0 holds
constexpr uint32_t kBlocksB = 16;
constexpr uint64_t kTier0Blocks = 32;  // tier0_budget = 128 KiB
constexpr uint64_t kCapA = 8;          // tier0 = "32KiB"
constexpr uint64_t kGuaranteeB = 12;   // guarantee=48KiB
constexpr const char* kClients = "cxltier-test-clients";
constexpr const char* kUserA = "cxltier-test-qa";
constexpr const char* kUserB = "cxltier-test-qb";

bool EnsureUsers() {
  // useradd where there is one; a QEMU guest's busybox root has none, so the
  // entries are written there (as useradd would).
  const std::string cmd =
      std::string("set -e; if command -v useradd >/dev/null; then ") + "getent group " + kClients +
      " >/dev/null || groupadd --system " + kClients + "; for u in " + kUserA + " " + kUserB +
      "; do getent passwd $u >/dev/null || useradd --system -M -N -g " + kClients +
      " -s /usr/sbin/nologin $u; done; else touch /etc/passwd /etc/group; grep -q '^" + kClients +
      ":' /etc/group || echo '" + kClients + ":x:4990:' >> /etc/group; grep -q '^" + kUserA +
      ":' /etc/passwd || echo '" + kUserA +
      ":x:4991:4990::/:/bin/false' >> /etc/passwd; grep -q '^" + kUserB +
      ":' /etc/passwd || echo '" + kUserB + ":x:4992:4990::/:/bin/false' >> /etc/passwd; fi 2>&1";
  const ShellResult r = Shell(cmd);
  EXPECT_EQ(r.status, 0) << r.out;
  return r.status == 0;
}

// A second memory node for tier 1 when the host has one (the kernel then
// tells the tiers apart); else both tiers on node 0, as the other tests run.
int SlowNode() { return std::filesystem::exists("/sys/devices/system/node/node1/meminfo") ? 1 : 0; }

// cxltierctl: $CXLTIERCTL (in a QEMU guest), else the build's.
std::string CtlPath() {
  const char* env = getenv("CXLTIERCTL");
  return env && *env ? env : CXLTIERCTL_PATH;
}

// A client loop in a child as `user`, fed commands through a pipe. Ends it
// and reports what it said when it goes out of scope (a failed ASSERT returns
// early: the child must not wait for commands that never come, and why it
// failed is worth seeing).
class ClientChild {
 public:
  ClientChild(const char* user, const std::function<std::string(int)>& loop) {
    if (pipe2(fds_, O_CLOEXEC) != 0) return;
    child_ = std::make_unique<ChildAs>(user, [&] {
      close(fds_[1]);
      return loop(fds_[0]);
    });
    close(fds_[0]);
  }
  ~ClientChild() {
    const std::string report = Finish();
    if (!report.empty()) ADD_FAILURE() << "client child: " << report;
  }
  void Send(char c) {
    if (write(fds_[1], &c, 1) != 1) ADD_FAILURE() << "the client child is gone";
  }
  // Quits the loop and returns what the child reported ("" = fine).
  std::string Finish() {
    if (!child_) return "";
    Send('q');
    close(fds_[1]);
    std::string report = child_->Wait();
    child_.reset();
    return report;
  }
  int command_fd() const { return fds_[1]; }

 private:
  int fds_[2] = {-1, -1};
  std::unique_ptr<ChildAs> child_;
};

// One user's share as root's status shows it.
struct Share {
  bool found = false;
  uint64_t tier0 = 0, live = 0, in_set = 0, quota_evictions = 0;
  bool capped = false;
  uint64_t cap0 = 0, guarantee = 0;
};

struct Seen {
  uint64_t ticks = 0;
  uint64_t tier0_blocks = 0;
  Share a, b;
  nlohmann::json quotas;
};

Share ShareOf(const nlohmann::json& users, uid_t uid) {
  Share s;
  for (const auto& u : users) {
    if (u["uid"].get<uid_t>() != uid) continue;
    s.found = true;
    s.tier0 = u["tiers"][0]["blocks"].get<uint64_t>();
    for (const auto& t : u["tiers"]) s.live += t["blocks"].get<uint64_t>();
    s.in_set = u["in_set"].get<uint64_t>();
    s.quota_evictions = u["quota_evictions"].get<uint64_t>();
    s.capped = u["tiers"][0].contains("cap_blocks");
    if (s.capped) s.cap0 = u["tiers"][0]["cap_blocks"].get<uint64_t>();
    s.guarantee = u["guarantee_blocks"].get<uint64_t>();
  }
  return s;
}

bool ReadStatus(const std::string& socket, uid_t a, uid_t b, Seen* out) {
  std::string text;
  if (!Client::DaemonStats(socket, "status", &text).ok()) return false;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("quotas")) return false;
  out->ticks = j["ticks"].get<uint64_t>();
  out->tier0_blocks = j["tiers"][0]["blocks"].get<uint64_t>();
  out->quotas = j["quotas"];
  out->a = ShareOf(j["quotas"]["users"], a);
  out->b = ShareOf(j["quotas"]["users"], b);
  return true;
}

// A pool's pages as the kernel places them: blocks whose page is on `node`.
// The parent maps the memfds it handed to the children (shared pages).
uint64_t BlocksOnNode(const uint8_t* base, uint32_t blocks, int node) {
  std::vector<void*> pages(blocks);
  std::vector<int> status(blocks, -1);
  for (uint32_t i = 0; i < blocks; ++i) pages[i] = const_cast<uint8_t*>(base) + i * kPage;
  if (move_pages(0, blocks, pages.data(), nullptr, status.data(), 0) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(std::count(status.begin(), status.end(), node));
}

// The client loop each user runs in its own process: admits its blocks, then
// touches every one of them each daemon tick (or none while idle) until the
// parent says quit. Commands from the parent, one byte each on `cmd`:
// 't' touch, 'i' idle, 'q' quit (EOF: quit too).
std::string RunClient(const std::string& socket, const char* name, int memfd, uint32_t blocks,
                      uint64_t seq, int cmd) {
  Status st;
  auto c = Client::Connect({socket, kTiny4KiB, blocks, name}, &st);
  if (!c) return std::string(name) + " cannot connect: " + st.message;
  uint32_t pool = 0;
  if (Status s = c->RegisterMemfdPool(memfd, blocks * kPage, kPage, blocks, &pool); !s.ok()) {
    return std::string(name) + " pool: " + s.message;
  }
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < blocks; ++i) entries.push_back({BlockKey::FromSequence(seq, i), i});
  std::vector<wire::AdmitResult> res;
  if (Status s = c->Admit(pool, entries, &res); !s.ok() || res.size() != blocks) {
    return std::string(name) + " admit: " + s.message;
  }
  fcntl(cmd, F_SETFL, O_NONBLOCK);
  bool touching = true;
  for (;;) {
    char b = 0;
    const ssize_t n = read(cmd, &b, 1);
    if (n == 0 || (n == 1 && b == 'q')) break;
    if (n == 1) touching = b == 't';
    if (touching) {
      for (const wire::AdmitResult& r : res) c->Observe(r.slot, 1.0f);
    }
    const uint64_t tick = c->daemon_ticks();
    if (!WaitFor([&] { return c->daemon_ticks() > tick; })) {
      return std::string(name) + ": the daemon stopped ticking";
    }
  }
  return "";
}

// A memfd of `blocks` pages, every page written (faulted in here, before the
// fork: the children inherit the fd, the parent maps it to ask the kernel).
struct Pool {
  int fd = -1;
  uint8_t* base = nullptr;
  uint32_t blocks = 0;
  explicit Pool(uint32_t n) : blocks(n) {
    fd = memfd_create("quota-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, n * kPage) != 0) return;
    void* p = mmap(nullptr, n * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<uint8_t*>(p);
    std::memset(base, 0x5a, n * kPage);
  }
  ~Pool() {
    if (base) munmap(base, blocks * kPage);
    if (fd >= 0) close(fd);
  }
};

TEST(DaemonQuota, CapGuaranteeAndAdminChangeWithTwoRealUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureUsers());
  const uid_t uid_a = UidOf(kUserA), uid_b = UidOf(kUserB);
  ASSERT_NE(uid_a, static_cast<uid_t>(-1));
  const int slow = SlowNode();
  const bool kernel_tells = slow != 0;
  DaemonProcess d(
      std::string("[engine]\npolicy = \"lru\"\ntier0_budget = \"128KiB\"\n"
                  "block_bytes = 4096\n"
                  "[[quotas.user]]\nuser = \"") +
          kUserA +
          "\"\ntier0 = \"32KiB\"\n"
          // Others' quotas, which A's `config show` must not list (root's cap
          // is the whole tier 0: no effect here).
          "[[quotas.user]]\nuid = 0\ntier0 = \"128KiB\"\n"
          "[[quotas.client]]\nname = \"hidden-from-users\"\nuid = 0\ntier0 = \"4KiB\"\n",
      "", std::string("socket_group = \"") + kClients + "\"\nadmin_group = \"\"\n",
      "fast_nodes = [0]\nslow_nodes = [" + std::to_string(slow) + "]\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  chmod(d.dir().c_str(), 0755);
  const std::string socket = d.socket();
  std::printf("tiers: fast node 0, slow node %d (%s)\n", slow,
              kernel_tells ? "the kernel's placement is checked against the caps"
                           : "one node: the kernel cannot tell the tiers apart here; "
                             "pages are checked resident on node 0");

  Pool pool_a(kBlocksA), pool_b(kBlocksB);
  ASSERT_TRUE(pool_a.base && pool_b.base);
  signal(SIGPIPE, SIG_IGN);  // a child that failed early closed its end

  Seen s;
  // Samples every status the parent reads, with the kernel's view.
  uint64_t samples = 0, max_a = 0, max_a_kernel = 0, min_b = UINT64_MAX, min_b_kernel = UINT64_MAX;
  std::string violations;
  auto sample = [&](uint64_t cap_a, uint64_t floor_b, const char* phase) {
    if (!ReadStatus(socket, uid_a, uid_b, &s)) {
      violations += std::string(phase) + ": no status; ";
      return;
    }
    ++samples;
    if (cap_a != UINT64_MAX) {
      max_a = std::max(max_a, s.a.tier0);
      if (s.a.tier0 > cap_a) {
        violations += std::string(phase) + ": A has " + std::to_string(s.a.tier0) +
                      " blocks in tier 0, over its cap; ";
      }
      if (s.a.in_set > cap_a) violations += std::string(phase) + ": A's set is over its cap; ";
    }
    if (floor_b) {
      min_b = std::min(min_b, s.b.tier0);
      if (s.b.tier0 < floor_b) {
        violations += std::string(phase) + ": B has only " + std::to_string(s.b.tier0) +
                      " blocks in tier 0; ";
      }
    }
    const uint64_t on0_a = BlocksOnNode(pool_a.base, kBlocksA, 0);
    const uint64_t on0_b = BlocksOnNode(pool_b.base, kBlocksB, 0);
    if (on0_a == UINT64_MAX || on0_b == UINT64_MAX) {
      violations += std::string(phase) + ": move_pages failed; ";
    } else if (kernel_tells) {
      // Moves finish before the daemon records them: the kernel may be a
      // move ahead of status, never behind a cap the planner keeps.
      if (cap_a != UINT64_MAX) {
        max_a_kernel = std::max(max_a_kernel, on0_a);
        if (on0_a > cap_a) {
          violations += std::string(phase) + ": the kernel has " + std::to_string(on0_a) +
                        " of A's blocks on the fast node; ";
        }
      }
      if (floor_b) {
        min_b_kernel = std::min(min_b_kernel, on0_b);
        if (on0_b < floor_b) {
          violations += std::string(phase) + ": the kernel has only " + std::to_string(on0_b) +
                        " of B's blocks on the fast node; ";
        }
      }
    } else if (on0_a != kBlocksA || on0_b != kBlocksB) {
      violations += std::string(phase) + ": pages not resident on node 0; ";
    }
  };
  // Samples for `ticks` daemon ticks.
  auto sample_for = [&](uint64_t ticks, uint64_t cap_a, uint64_t floor_b, const char* phase) {
    ASSERT_TRUE(ReadStatus(socket, uid_a, uid_b, &s));
    const uint64_t until = s.ticks + ticks;
    ASSERT_TRUE(WaitFor([&] {
      sample(cap_a, floor_b, phase);
      return s.ticks >= until;
    })) << phase;
  };

  // B first: its 16 blocks settle in tier 0 (the whole of them fit).
  ClientChild b(kUserB,
                [&](int cmd) { return RunClient(socket, "b", pool_b.fd, kBlocksB, 2, cmd); });
  ASSERT_TRUE(WaitFor([&] {
    return ReadStatus(socket, uid_a, uid_b, &s) && s.b.live == kBlocksB && s.b.tier0 == kBlocksB;
  })) << "B's blocks did not settle in tier 0: "
      << s.quotas.dump() << d.Log();

  // Phase 1, the cap: A's 40 hot blocks, more than tier 0 holds, each
  // touched every tick. A stays within 8; B keeps all 16 from A's admission on.
  ClientChild a(kUserA, [&](int cmd) {
    close(b.command_fd());  // inherited: B's commands are the parent's
    return RunClient(socket, "a", pool_a.fd, kBlocksA, 1, cmd);
  });
  ASSERT_TRUE(WaitFor([&] {
    sample(UINT64_MAX, kBlocksB, "A admitted");
    return s.a.live == kBlocksA && s.a.tier0 <= kCapA;
  })) << "A's blocks did not come within its cap: "
      << s.quotas.dump();
  sample_for(150, kCapA, kBlocksB, "cap");
  EXPECT_TRUE(s.a.capped);
  EXPECT_EQ(s.a.cap0, kCapA);
  EXPECT_GT(s.a.quota_evictions, 0u) << "A's misses over its cap took none of its own blocks";
  EXPECT_EQ(s.b.quota_evictions, 0u);
  const uint64_t a_evictions_cap = s.a.quota_evictions;
  std::printf(
      "cap phase: %llu samples, A max %llu in tier 0 (cap %llu), B min %llu of %u, "
      "A quota evictions %llu\n",
      static_cast<unsigned long long>(samples), static_cast<unsigned long long>(max_a),
      static_cast<unsigned long long>(kCapA), static_cast<unsigned long long>(min_b), kBlocksB,
      static_cast<unsigned long long>(a_evictions_cap));

  // A non-admin uid may not set quotas, and sees its own share only.
  const std::string a_report = RunAs(kUserA, [&]() -> std::string {
    std::string fail, text;
    const Status st = Client::DaemonAdmin(socket, wire::AdminOp::kSetQuota,
                                          std::string("user=") + kUserA + " none", &text);
    if (st.ok() || st.code != wire::ErrorCode::kDenied) fail += "A's quota set was not denied; ";
    for (const char* what : {"status", "quotas"}) {
      if (!Client::DaemonStats(socket, what, &text).ok()) return "A's stats failed";
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      const nlohmann::json& users =
          std::string(what) == "status" ? j["quotas"]["users"] : j["users"];
      if (users.size() != 1 || users[0]["uid"].get<uid_t>() != getuid()) {
        fail += std::string(what) + " shows A other users: " + users.dump() + "; ";
      }
    }
    // The configuration too: its own quota, nobody else's, no other uid's client quota
    // ("\nuid = 0\n": max_tier_pool_bytes_per_uid = 0 ends with "uid = 0" too).
    if (!Client::DaemonAdmin(socket, wire::AdminOp::kShowConfig, "", &text).ok()) {
      return fail + "A's config show failed";
    }
    if (text.find("uid = " + std::to_string(getuid())) == std::string::npos ||
        text.find("\nuid = 0\n") != std::string::npos ||
        text.find("hidden-from-users") != std::string::npos ||
        text.find("yours only") == std::string::npos) {
      fail += "A's config show: " + text;
    }
    return fail;
  });
  EXPECT_EQ(a_report, "");
  std::string root_config;
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kShowConfig, "", &root_config).ok());
  EXPECT_NE(root_config.find("hidden-from-users"), std::string::npos) << root_config;
  EXPECT_NE(root_config.find("\nuid = 0\n"), std::string::npos) << root_config;
  EXPECT_NE(d.Log().find("denied quota set"), std::string::npos);

  // Phase 2, the guarantee, set through the real socket as root: B gets 12
  // blocks and goes idle; A loses its cap (with cxltierctl) and keeps
  // touching all 40. A's misses take B's blocks above 12, never below.
  std::string text;
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kSetQuota,
                                  std::string("user=") + kUserB + " guarantee=48KiB", &text)
                  .ok())
      << text;
  EXPECT_NE(text.find("guarantee 12 blocks"), std::string::npos) << text;
  b.Send('i');
  const ShellResult ctl =
      Shell(CtlPath() + " --socket " + socket + " quota set user=" + kUserA + " none 2>&1");
  ASSERT_EQ(ctl.status, 0) << ctl.out;
  ASSERT_TRUE(WaitFor([&] {
    sample(UINT64_MAX, kGuaranteeB, "guarantee");
    return s.a.tier0 > kCapA && s.b.tier0 == kGuaranteeB;
  })) << "A did not grow past its old cap, or B did not come down to its guarantee: "
      << s.quotas.dump();
  EXPECT_FALSE(s.a.capped);
  EXPECT_EQ(s.b.guarantee, kGuaranteeB);
  sample_for(150, UINT64_MAX, kGuaranteeB, "guarantee");
  const uint64_t min_b_guarantee = min_b;
  std::printf("guarantee phase: A %llu in tier 0 (uncapped), B min %llu (guarantee %llu)\n",
              static_cast<unsigned long long>(s.a.tier0),
              static_cast<unsigned long long>(min_b_guarantee),
              static_cast<unsigned long long>(kGuaranteeB));

  // The control: without the guarantee, the same traffic takes B's blocks.
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kSetQuota,
                                  std::string("user=") + kUserB + " none", &text)
                  .ok())
      << text;
  ASSERT_TRUE(WaitFor([&] {
    return ReadStatus(socket, uid_a, uid_b, &s) && s.b.tier0 < kGuaranteeB / 2;
  })) << "B kept its blocks without a guarantee: the guarantee did nothing? "
      << s.quotas.dump();
  std::printf("no guarantee: B down to %llu in tier 0\n",
              static_cast<unsigned long long>(s.b.tier0));

  // A reload brings back the file's quotas: A's cap again.
  const ShellResult status_text = Shell(CtlPath() + " --socket " + socket + " quota 2>&1");
  EXPECT_EQ(status_text.status, 0) << status_text.out;
  EXPECT_NE(status_text.out.find(std::string(kUserA) + " (" + std::to_string(uid_a) + ")"),
            std::string::npos)
      << status_text.out;
  EXPECT_NE(status_text.out.find(std::string(kUserB)), std::string::npos) << status_text.out;
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kReload, "", &text).ok()) << text;
  ASSERT_TRUE(WaitFor([&] {
    return ReadStatus(socket, uid_a, uid_b, &s) && s.a.capped && s.a.tier0 <= kCapA;
  })) << "the reload did not restore A's cap: "
      << s.quotas.dump();

  EXPECT_EQ(a.Finish(), "");
  EXPECT_EQ(b.Finish(), "");
  EXPECT_EQ(violations, "");
  std::printf(
      "figures: %llu samples; A max %llu in tier 0 by status (cap %llu)%s; B min %llu "
      "with its guarantee of %llu; tier 0 holds %llu\n",
      static_cast<unsigned long long>(samples), static_cast<unsigned long long>(max_a),
      static_cast<unsigned long long>(kCapA),
      kernel_tells ? (", " + std::to_string(max_a_kernel) + " by the kernel, B min " +
                      std::to_string(min_b_kernel) + " by the kernel")
                         .c_str()
                   : "",
      static_cast<unsigned long long>(min_b_guarantee),
      static_cast<unsigned long long>(kGuaranteeB), static_cast<unsigned long long>(kTier0Blocks));
}

// Client quotas (issue 30 item 5): keyed by uid and hello name, one account
// for that uid's connections of that name, and the uid's cap on top: root
// has no user quota, so its client quota's cap is root's too, and its
// connection named "free" shares it. A user quota is the uid's cap instead.
TEST(DaemonQuota, ClientQuotaIsPerUidAndNameUnderTheUidsCap) {
  DaemonProcess d(
      "[engine]\npolicy = \"lru\"\ntier0_budget = \"128KiB\"\nblock_bytes = 4096\n"
      "[[quotas.client]]\nname = \"capped\"\nuid = " +
      std::to_string(getuid()) + "\ntier0 = \"16KiB\"\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  constexpr uint32_t kBlocks = 12;
  constexpr int kConns = 3;
  Pool pools[kConns] = {Pool(kBlocks), Pool(kBlocks), Pool(kBlocks)};
  std::unique_ptr<Client> clients[kConns];
  std::vector<wire::AdmitResult> slots[kConns];
  // Two connections of the capped name, one of another.
  const char* names[kConns] = {"capped", "capped", "free"};
  for (int i = 0; i < kConns; ++i) {
    Status st;
    clients[i] = Client::Connect({d.socket(), kTiny4KiB, kBlocks, names[i]}, &st);
    ASSERT_TRUE(clients[i]) << st.message;
    uint32_t pool = 0;
    ASSERT_TRUE(
        clients[i]->RegisterMemfdPool(pools[i].fd, kBlocks * kPage, kPage, kBlocks, &pool).ok());
    std::vector<wire::AdmitEntry> entries;
    for (uint32_t b = 0; b < kBlocks; ++b)
      entries.push_back({BlockKey::FromSequence(10 + i, b), b});
    ASSERT_TRUE(clients[i]->Admit(pool, entries, &slots[i]).ok());
  }
  // Every client touches every block each tick; then the quotas view.
  nlohmann::json q;
  auto touch_and_read = [&] {
    for (int i = 0; i < kConns; ++i) {
      if (!clients[i]) continue;
      for (const wire::AdmitResult& r : slots[i]) clients[i]->Observe(r.slot, 1.0f);
    }
    WaitTicks(*clients[0], 1);
    std::string text;
    if (!Client::DaemonStats(d.socket(), "quotas", &text).ok()) return false;
    q = nlohmann::json::parse(text, nullptr, false);
    return !q.is_discarded();
  };
  auto client_tier0 = [&](const char* name) -> uint64_t {
    for (const auto& c : q["clients"]) {
      if (c["name"] == name) return c["tiers"][0]["blocks"].get<uint64_t>();
    }
    return UINT64_MAX;
  };
  auto root = [&]() -> nlohmann::json {
    for (const auto& u : q["users"]) {
      if (u["uid"] == getuid()) return u;
    }
    return {};
  };
  auto root_tier0 = [&]() -> uint64_t {
    const nlohmann::json u = root();
    return u.is_null() ? UINT64_MAX : u["tiers"][0]["blocks"].get<uint64_t>();
  };
  // Settled: the uid within 4 blocks over its three connections; then so for
  // 100 ticks, and the two connections named "capped" share one row.
  ASSERT_TRUE(WaitFor([&] { return touch_and_read() && root_tier0() <= 4; }))
      << "root did not come within its client quota's 4 blocks: " << q.dump();
  uint64_t max_root = 0;
  for (int n = 0; n < 100; ++n) {
    ASSERT_TRUE(touch_and_read());
    max_root = std::max(max_root, root_tier0());
    ASSERT_LE(root_tier0(), 4u) << "another name escaped the uid's cap: " << q.dump();
    ASSERT_LE(root()["in_set"].get<uint64_t>(), 4u) << q.dump();
    ASSERT_LE(client_tier0("capped"), 4u) << q.dump();
  }
  ASSERT_EQ(q["clients"].size(), 1u) << q.dump();  // one account for both "capped"; none for "free"
  EXPECT_EQ(q["clients"][0]["tiers"][0]["cap_blocks"], 4);
  EXPECT_EQ(root()["tiers"][0]["cap_blocks"], 4) << "the uid's cap on top: " << q.dump();
  EXPECT_GT(q["clients"][0]["quota_evictions"].get<uint64_t>(), 0u);
  // A user quota is the uid's cap instead: all of tier 0 (32 blocks), so
  // "free" is no longer held to the client quota's 4.
  std::string text;
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kSetQuota,
                                  "uid=" + std::to_string(getuid()) + " tier0=128KiB", &text)
                  .ok())
      << text;
  ASSERT_TRUE(WaitFor([&] {
    return touch_and_read() && client_tier0("capped") <= 4 &&
           root_tier0() == client_tier0("capped") + kBlocks;
  })) << "with a user quota, the name without a client quota is the uid's cap's only: "
      << q.dump();
  // Raised at run time for the connected clients of that uid and name: at once.
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kSetQuota,
                                  "client=capped uid=" + std::to_string(getuid()) + " tier0=32KiB",
                                  &text)
                  .ok())
      << text;
  EXPECT_NE(text.find("2 connected client(s) of that uid and name"), std::string::npos) << text;
  ASSERT_TRUE(WaitFor([&] { return touch_and_read() && client_tier0("capped") > 4; })) << q.dump();
  EXPECT_LE(client_tier0("capped"), 8u);
  // A quota for a name that said hello without one applies at once to the
  // blocks it holds: 4 KiB is one block.
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kSetQuota,
                                  "client=free uid=" + std::to_string(getuid()) + " tier0=4KiB",
                                  &text)
                  .ok())
      << text;
  EXPECT_NE(text.find("1 connected client(s) of that uid and name"), std::string::npos) << text;
  ASSERT_TRUE(WaitFor([&] { return touch_and_read() && client_tier0("free") <= 1; }))
      << "the new quota of the connected client 'free' did not apply: " << q.dump();
  // A client quota without its uid is refused, naming why; so is a bad one.
  Status bad =
      Client::DaemonAdmin(d.socket(), wire::AdminOp::kSetQuota, "client=capped tier0=4KiB", &text);
  EXPECT_EQ(bad.code, wire::ErrorCode::kBadPayload);
  EXPECT_NE(bad.message.find("needs uid= or user= too"), std::string::npos) << bad.message;
  bad = Client::DaemonAdmin(d.socket(), wire::AdminOp::kSetQuota,
                            "client=capped uid=" + std::to_string(getuid()) + " tiers=1,1", &text);
  EXPECT_EQ(bad.code, wire::ErrorCode::kBadPayload);
  EXPECT_NE(bad.message.find("the last (tier 1) is never capped"), std::string::npos)
      << bad.message;
  // A reload whose file caps this host's last tier is refused, naming it; the
  // running quotas stay.
  std::ofstream(d.config_path(), std::ios::app) << "[[quotas.user]]\nuid = 5\ntiers = [1, 1]\n";
  const Status reload = Client::DaemonAdmin(d.socket(), wire::AdminOp::kReload, "", &text);
  EXPECT_FALSE(reload.ok());
  EXPECT_NE(reload.message.find("uid 5: caps for 2 tiers, but this host has 2 tiers"),
            std::string::npos)
      << reload.message;
  ASSERT_TRUE(touch_and_read());
  for (const auto& c : q["clients"]) {
    if (c["name"] == "capped") {
      EXPECT_EQ(c["tiers"][0]["cap_blocks"], 8) << q.dump();
    }
  }
  // The clients leave: their rows go with them (the user quota's row stays).
  for (auto& c : clients) c.reset();
  ASSERT_TRUE(WaitFor([&] {
    std::string t;
    if (!Client::DaemonStats(d.socket(), "quotas", &t).ok()) return false;
    q = nlohmann::json::parse(t, nullptr, false);
    return !q.is_discarded() && q["clients"].empty() && root_tier0() == 0;
  })) << q.dump();
  std::printf(
      "figures: root's three connections (two named capped, one free, 12 hot blocks each) held "
      "at most %llu blocks in tier 0 (the client quota's 4 is the uid's cap)\n",
      static_cast<unsigned long long>(max_root));
}

}  // namespace
}  // namespace cxltier::testing
