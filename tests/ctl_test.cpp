// cxltierctl: the plan figures, and the real binary's output and exit codes.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "shell.h"

#include "plan.h"
#include "share.h"

namespace cxltier::ctl {
namespace {

using cxltier::testing::Shell;
using cxltier::testing::ShellResult;

const std::string kCtl = CXLTIERCTL_PATH;

TEST(Plan, JsonHasTheSeedsNumbers) {
  const nlohmann::json j = PlanJson(kLlama3_70B, 131072);
  EXPECT_EQ(j["streams"], 640);
  EXPECT_EQ(j["gqa_group"], 8);
  EXPECT_EQ(j["bytes_per_token"], 327680);
  EXPECT_EQ(j["block_tokens"], 16);
  EXPECT_EQ(j["block_bytes"], 5242880);
  EXPECT_EQ(j["blocks"], 8192);
  EXPECT_EQ(j["kv_bytes"], 42949672960ull);
  EXPECT_EQ(j["state_bytes"], 524288);
  EXPECT_NEAR(j["state_overhead_percent"].get<double>(), 0.0012, 0.00005);
  EXPECT_EQ(j["retracted"]["bytes"], 671088640);
  EXPECT_NEAR(j["retracted"]["overhead_percent"].get<double>(), 1.56, 0.005);
}

TEST(Plan, TableShowsReadableFigures) {
  const std::string t = PlanTable(kLlama3_70B, 131072);
  for (const char* s :
       {"640 (80 layers x 8 KV heads)", "327,680 B (320 KiB)", "5,242,880 B (5.00 MiB)", "8,192",
        "42,949,672,960 B (40.0 GiB)", "524,288 B (512 KiB)", "0.0012% of KV",
        "671,088,640 B (640 MiB)", "1.56% of KV"}) {
    EXPECT_NE(t.find(s), std::string::npos) << "missing '" << s << "' in\n" << t;
  }
}

TEST(Plan, GroupedDigits) {
  EXPECT_EQ(Grouped(0), "0");
  EXPECT_EQ(Grouped(999), "999");
  EXPECT_EQ(Grouped(1000), "1,000");
  EXPECT_EQ(Grouped(42949672960ull), "42,949,672,960");
}

TEST(Plan, PerLayerNamesTheSmallestCache) {
  const nlohmann::json j = PerLayerJson(kModelPresets, 131072);
  EXPECT_EQ(j["models"].size(), std::size(kModelPresets));
  EXPECT_EQ(j["smallest_per_layer"], "qwen2.5-7b");
  EXPECT_EQ(j["models"][0]["per_layer_kv_bytes"], 536870912);
  EXPECT_EQ(j["models"][0]["mha_per_layer_kv_bytes"], 4294967296ull);
}

TEST(Share, EveryTierEachUserAndClientWithCapsAndShare) {
  const nlohmann::json q = nlohmann::json::parse(R"({
    "quota_evictions": 4,
    "users": [
      {"uid": 1001, "quota": true, "in_set": 2, "quota_evictions": 4,
       "guarantee_blocks": 1, "guarantee_bytes": 1048576,
       "tiers": [{"tier": 0, "blocks": 2, "bytes": 2097152, "cap_blocks": 2, "cap_bytes": 2097152},
                 {"tier": 1, "blocks": 1, "bytes": 1048576},
                 {"tier": 2, "blocks": 0, "bytes": 0}]},
      {"uid": 4242, "quota": false, "in_set": 6, "quota_evictions": 0,
       "guarantee_blocks": 0, "guarantee_bytes": 0,
       "tiers": [{"tier": 0, "blocks": 6, "bytes": 6291456},
                 {"tier": 1, "blocks": 0, "bytes": 0},
                 {"tier": 2, "blocks": 9, "bytes": 9437184}]}],
    "clients": [
      {"uid": 1001, "id": 3, "name": "vllm-0", "quota": true, "in_set": 0, "quota_evictions": 0,
       "tiers": [{"tier": 0, "blocks": 0, "bytes": 0, "cap_blocks": 0, "cap_bytes": 0},
                 {"tier": 1, "blocks": 1, "bytes": 1048576},
                 {"tier": 2, "blocks": 0, "bytes": 0}]}]})");
  const std::string t =
      ShareTable(q, 8 << 20, [](uint32_t uid) { return uid == 1001 ? "alice" : ""; });
  for (const char* s :
       {"tier 0", "tier 1", "tier 2", "alice (1001)", "2.00 MiB/2.00 MiB", "uid 4242", "6.00 MiB",
        "9.00 MiB", "25.0%", "75.0%", "1.00 MiB", "client vllm-0 #3", "0 B/0 B"}) {
    EXPECT_NE(t.find(s), std::string::npos) << "missing '" << s << "' in\n" << t;
  }
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 4);  // a header and three rows
  EXPECT_EQ(ShareTable(nlohmann::json::parse(R"({"users": [], "clients": []})"), 0, nullptr), "");
}

TEST(CxltierctlBinary, PlanJsonWithSuffixContext) {
  const ShellResult r = Shell(kCtl + " plan --model llama3-70b --context 128k --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["blocks"], 8192);
  EXPECT_EQ(j["kv_bytes"], 42949672960ull);
  EXPECT_EQ(j["model"], "llama3-70b");
}

TEST(CxltierctlBinary, PartialBlockRoundsUp) {
  const ShellResult r = Shell(kCtl + " plan --context 131073 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["blocks"], 8193);
}

TEST(CxltierctlBinary, CustomGeometryByFlags) {
  const ShellResult r = Shell(kCtl +
                              " plan --layers 2 --query-heads 4 --kv-heads 2 --head-dim 8 "
                              "--dtype-bytes 1 --block-tokens 4 --context 10 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"], "custom");
  EXPECT_EQ(j["bytes_per_token"], 2 * 2 * 2 * 8 * 1);
  EXPECT_EQ(j["blocks"], 3);
  EXPECT_EQ(j["gqa_group"], 2);
}

TEST(CxltierctlBinary, BadInputIsAClearError) {
  ShellResult r = Shell(kCtl + " plan --model nope 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("unknown model 'nope'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("llama3-70b"), std::string::npos) << r.out;
  r = Shell(kCtl + " plan --context 12x 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--context '12x'"), std::string::npos) << r.out;
  r = Shell(kCtl + " plan --kv-heads 3 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("multiple of KV heads"), std::string::npos) << r.out;
}

TEST(CxltierctlBinary, PerLayerTable) {
  const ShellResult r = Shell(kCtl + " plan --per-layer --context 128k");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("qwen2.5-7b"), std::string::npos);
  EXPECT_NE(r.out.find("256 MiB"), std::string::npos);
  EXPECT_NE(r.out.find("smallest per-layer cache: qwen2.5-7b"), std::string::npos);
}

// A daemon that takes connections and never answers (wedged): the request
// fails after --timeout with a clear error, instead of hanging (a liveness
// probe left hanging keeps its process until the pod's restart).
TEST(CxltierctlBinary, ADaemonThatNeverAnswersIsATimeoutNotAHang) {
  char dir[] = "/tmp/cxltierctl-wedged-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/wedged.sock";
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);  // connections wait in the backlog, never accepted
  // `timeout` ends a hang as a failure of this test (124), not of ctest.
  for (const char* command : {"status", "config show", "quota", "reload"}) {
    const ShellResult r =
        Shell("timeout 120 " + kCtl + " --socket " + path + " --timeout 0.3 " + command + " 2>&1");
    EXPECT_EQ(r.status, 1) << command << ": " << r.out;
    EXPECT_NE(r.out.find("did not answer within 0.3 s (--timeout)"), std::string::npos) << r.out;
    // A change asked for may still be made: the message says so.
    EXPECT_EQ(r.out.find("may still make the change") != std::string::npos,
              std::string(command) == "reload")
        << r.out;
  }
  close(listener);
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace cxltier::ctl
