// Isolation and authorization with real users: a daemon whose socket belongs
// to a clients group, a client of another uid in that group, and an admin
// user. Creates the users and groups (needs root; skipped otherwise).
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "daemon_harness.h"
#include "engine/policy.h"
#include "models.h"
#include "run_as.h"
#include "shell.h"

namespace cxltier::testing {
namespace {

constexpr uint64_t kBlock = 4096;  // pool stride: one page
constexpr const char* kClients = "cxltier-test-clients";
constexpr const char* kAdmins = "cxltier-test-admins";
constexpr const char* kUserB = "cxltier-test-b";
constexpr const char* kAdmin = "cxltier-test-admin";

BlockKey K(uint64_t i) { return BlockKey::FromSequence(91, i); }

bool EnsureUsers() {
  const std::string cmd =
      std::string("set -e; ") + "getent group " + kClients + " >/dev/null || groupadd --system " +
      kClients + "; getent group " + kAdmins + " >/dev/null || groupadd --system " + kAdmins +
      "; getent passwd " + kUserB + " >/dev/null || useradd --system -M -N -g " + kClients +
      " -s /usr/sbin/nologin " + kUserB + "; getent passwd " + kAdmin +
      " >/dev/null || useradd --system -M -N -g " + kClients + " -G " + kAdmins +
      " -s /usr/sbin/nologin " + kAdmin + " 2>&1";
  const ShellResult r = Shell(cmd);
  EXPECT_EQ(r.status, 0) << r.out;
  return r.status == 0;
}

TEST(Isolation, AnotherUidCannotTouchBlocksAndOnlyAdminsMayChangePolicy) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureUsers());
  DaemonProcess d(
      "", "",
      std::string("socket_group = \"") + kClients + "\"\nadmin_group = \"" + kAdmins + "\"");
  ASSERT_TRUE(d.Alive()) << d.Log();
  // The socket: mode 0660, group of the clients; its directory must let them in.
  struct stat sst {};
  ASSERT_EQ(stat(d.socket().c_str(), &sst), 0);
  EXPECT_EQ(sst.st_mode & 0777, 0660u);
  EXPECT_EQ(sst.st_gid, getgrnam(kClients)->gr_gid);
  chmod(d.dir().c_str(), 0755);

  // Client A (root) holds K(1) and K(2) in a memfd pool.
  Status st;
  auto a = Client::Connect({d.socket(), kTiny4KiB, 16, "a"}, &st);
  ASSERT_TRUE(a) << st.message;
  const int memfd = memfd_create("iso-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(memfd, 16 * kBlock), 0);
  uint32_t pool = 0;
  ASSERT_TRUE(a->RegisterMemfdPool(memfd, 16 * kBlock, kBlock, 16, &pool).ok());
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(a->Admit(pool, std::vector<wire::AdmitEntry>{{K(1), 0}, {K(2), 1}}, &res).ok());
  std::vector<Tier> a_tiers;
  ASSERT_TRUE(a->QueryTiers(std::vector<BlockKey>{K(1), K(2)}, &a_tiers).ok());

  const pid_t daemon_pid = d.pid();
  const std::string socket = d.socket();
  const std::string b_report = RunAs(kUserB, [&]() -> std::string {
    std::string fail;
    Status s;
    auto b = Client::Connect({socket, kTiny4KiB, 16, "b"}, &s);
    if (!b) return "user b cannot connect: " + s.message;
    // A's keys do not exist for b: not queryable, not releasable.
    std::vector<Tier> t;
    if (!b->QueryTiers(std::vector<BlockKey>{K(1), K(2)}, &t).ok() || t.size() != 2 ||
        t[0] != Tier::kNone || t[1] != Tier::kNone) {
      fail += "b sees a's blocks; ";
    }
    wire::ReleaseOk rel;
    if (!b->Release(std::vector<BlockKey>{K(1)}, &rel).ok() || rel.released != 0 ||
        rel.unknown != 1) {
      fail += "b released a's block; ";
    }
    // b may use the same key for its own block: a different block.
    const int fd = memfd_create("b-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(fd, 4 * kBlock) != 0) return "ftruncate";
    uint32_t bp = 0;
    std::vector<wire::AdmitResult> r;
    if (!b->RegisterMemfdPool(fd, 4 * kBlock, kBlock, 4, &bp).ok() ||
        !b->Admit(bp, std::vector<wire::AdmitEntry>{{K(1), 0}}, &r).ok() || r.size() != 1 ||
        r[0].restored) {
      fail += "b could not admit its own K(1) as a new block; ";
    }
    // b's segment holds b's slots only: every other slot is empty.
    for (uint32_t i = 0; i < b->slots() && !r.empty(); ++i) {
      const BlockState* bs = b->SlotState(i);
      if (i != r[0].slot && bs->generation != 0) fail += "b's segment has a foreign slot; ";
    }
    // The daemon's fds (a's segment and pool among them) are out of b's reach.
    const std::string fd_dir = "/proc/" + std::to_string(daemon_pid) + "/fd";
    for (int n = 0; n < 64; ++n) {
      const int o = open((fd_dir + "/" + std::to_string(n)).c_str(), O_RDONLY | O_CLOEXEC);
      if (o >= 0) {
        close(o);
        fail += "b opened the daemon's fd " + std::to_string(n) + "; ";
      }
    }
    // Operator requests: config show yes; policy set, reload and recording
    // (every user's traffic) no.
    std::string text;
    if (!Client::DaemonAdmin(socket, wire::AdminOp::kShowConfig, "", &text).ok() ||
        text.find("[engine]") == std::string::npos) {
      fail += "config show refused to b; ";
    }
    s = Client::DaemonAdmin(socket, wire::AdminOp::kSetPolicy, "lru", &text);
    if (s.ok() || s.code != wire::ErrorCode::kDenied) fail += "b changed the policy; ";
    s = Client::DaemonAdmin(socket, wire::AdminOp::kReload, "", &text);
    if (s.ok() || s.code != wire::ErrorCode::kDenied) fail += "b reloaded; ";
    s = Client::DaemonAdmin(socket, wire::AdminOp::kRecordStart, "10", &text);
    if (s.ok() || s.code != wire::ErrorCode::kDenied) fail += "b started a recording; ";
    int got = -1;
    s = Client::DaemonAdmin(socket, wire::AdminOp::kRecordStop, "", &text, &got);
    if (s.ok() || s.code != wire::ErrorCode::kDenied || got >= 0) fail += "b took a recording; ";
    close(fd);
    return fail;
  });
  EXPECT_EQ(b_report, "");
  // A's blocks are untouched.
  std::vector<Tier> after;
  ASSERT_TRUE(a->QueryTiers(std::vector<BlockKey>{K(1), K(2)}, &after).ok());
  EXPECT_EQ(after, a_tiers);
  EXPECT_NE(after[0], Tier::kNone);
  EXPECT_NE(d.Log().find("denied policy set"), std::string::npos) << d.Log();

  // The admin (supplementary member of the admin group) may switch the policy.
  const std::string admin_report = RunAs(kAdmin, [&]() -> std::string {
    std::string text;
    const Status s = Client::DaemonAdmin(socket, wire::AdminOp::kSetPolicy, "ema:0.05", &text);
    if (!s.ok()) return "admin policy set: " + s.message;
    const Status bad = Client::DaemonAdmin(socket, wire::AdminOp::kSetPolicy, "nonsense", &text);
    if (bad.ok() || bad.message.find("nonsense") == std::string::npos) {
      return "a bad policy name was accepted: " + bad.message;
    }
    return "";
  });
  EXPECT_EQ(admin_report, "");
  std::string text;
  ASSERT_TRUE(Client::DaemonStats(d.socket(), "status", &text).ok());
  EXPECT_EQ(nlohmann::json::parse(text)["policy"], "ema:0.05");
  // Root reloads: the file names no policy, so the default again.
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kReload, "", &text).ok()) << text;
  ASSERT_TRUE(Client::DaemonStats(d.socket(), "status", &text).ok());
  EXPECT_EQ(nlohmann::json::parse(text)["policy"], std::string(engine::kDefaultPolicy));
  close(memfd);
}

}  // namespace
}  // namespace cxltier::testing
