// cxltier-replay's parts: FitToPool (the trace every arm of the comparison
// and cxltier-sim replay) and Residency (where the kernel says pages are).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fit.h"
#include "host.h"
#include "integration/daemon_harness.h"
#include "shell.h"

namespace cxltier::replay {
namespace {

sim::Trace Touches(std::initializer_list<std::pair<uint32_t, uint32_t>> step_key, uint32_t keys) {
  sim::Trace t;
  for (uint32_t k = 0; k < keys; ++k) t.keys.push_back(BlockKey{1, k});
  for (auto [step, key] : step_key) {
    t.events.push_back(sim::TraceEvent{step, key, 1.0f, sim::EventKind::kTouch});
  }
  return t;
}

TEST(FitToPool, AFullPoolReleasesItsLeastRecentlyTouchedBlock) {
  // Keys 0, 1, then 0 again (now the most recent), then 2: the pool of two
  // must free key 1, not key 0.
  const sim::Trace t = Touches({{0, 0}, {1, 1}, {2, 0}, {3, 2}, {4, 1}}, 3);
  FitStats s;
  const sim::Trace f = FitToPool(t, 2, &s);
  ASSERT_EQ(f.events.size(), 7u);
  EXPECT_EQ(f.events[3].kind, sim::EventKind::kRelease);
  EXPECT_EQ(f.events[3].key, 1u);
  EXPECT_EQ(f.events[3].step, 3u);  // at the step of the admission that needed room
  EXPECT_EQ(f.events[4].key, 2u);
  EXPECT_EQ(f.events[5].kind, sim::EventKind::kRelease);  // key 1 comes back: key 0 goes
  EXPECT_EQ(f.events[5].key, 0u);
  EXPECT_EQ(s.forced_releases, 2u);
  EXPECT_EQ(s.max_live, 2u);
  EXPECT_EQ(s.admissions, 4u);
  EXPECT_EQ(s.readmissions, 1u);
  EXPECT_TRUE(f.Validate().ok()) << f.Validate().message;
}

TEST(FitToPool, KeepsTheTracesOwnReleasesAndDropsReleasesOfBlocksNotLive) {
  sim::Trace t = Touches({{0, 0}, {0, 1}}, 2);
  t.events.push_back(sim::TraceEvent{1, 0, 0.0f, sim::EventKind::kRelease});
  t.events.push_back(sim::TraceEvent{1, 0, 0.0f, sim::EventKind::kRelease});  // not live now
  t.events.push_back(sim::TraceEvent{2, 0, 1.0f, sim::EventKind::kTouch});
  FitStats s;
  const sim::Trace f = FitToPool(t, 8, &s);
  ASSERT_EQ(f.events.size(), 4u);
  EXPECT_EQ(f.events[2].kind, sim::EventKind::kRelease);
  EXPECT_EQ(s.forced_releases, 0u);
  EXPECT_EQ(s.readmissions, 1u);
  // Big enough for everything: the trace is unchanged but for the dropped release.
  std::vector<sim::TraceEvent> want = t.events;
  want.erase(want.begin() + 3);
  ASSERT_EQ(f.events.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.events[i].step, want[i].step) << i;
    EXPECT_EQ(f.events[i].key, want[i].key) << i;
    EXPECT_EQ(f.events[i].kind, want[i].kind) << i;
  }
}

TEST(FitToPool, KeepsHintsAndGroupsAsTheyAre) {
  sim::Trace t = Touches({{0, 0}, {0, 1}}, 3);
  t.groups = {0, 7, 7};
  t.events.push_back(sim::TraceEvent{1, 7, 1.0f, sim::EventKind::kHint});  // group 7 idle
  t.events.push_back(sim::TraceEvent{2, 2, 1.0f, sim::EventKind::kTouch});
  t.events.push_back(sim::TraceEvent{3, 7, 3.0f, sim::EventKind::kHint});  // group 7 done
  const sim::Trace f = FitToPool(t, 2, nullptr);
  EXPECT_EQ(f.groups, t.groups);
  std::vector<std::pair<uint32_t, float>> hints;
  for (const sim::TraceEvent& e : f.events) {
    if (e.kind == sim::EventKind::kHint) hints.push_back({e.key, e.obs});
  }
  const std::vector<std::pair<uint32_t, float>> want = {{7, 1.0f}, {7, 3.0f}};
  EXPECT_EQ(hints, want);
  EXPECT_TRUE(f.Validate().ok()) << f.Validate().message;
}

// One run of cxltier-replay with `args`, its JSON written to `json_path`:
// the JSON (discarded when the run wrote none), what the tool printed, and
// its exit status.
struct ReplayRun {
  nlohmann::json json;
  std::string out;
  int status = 0;
};
ReplayRun RunReplay(const std::string& args, const std::string& json_path) {
  std::remove(json_path.c_str());
  const testing::ShellResult r = testing::Shell(std::string(CXLTIER_REPLAY_PATH) + " " + args +
                                                " --json '" + json_path + "' 2>&1");
  std::ifstream in(json_path);
  return {nlohmann::json::parse(in, nullptr, false), r.out, r.status};
}

// The tool against a real cxltierd: with --hints every hint of the trace
// reaches the daemon (which counts them), and without it none does.
TEST(Replay, HintsReachTheDaemonOnlyWhenAsked) {
  testing::DaemonProcess d("[engine]\ntier0_budget = \"4MiB\"\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string attention =
      "steps=300,sessions=4,batch=2,context_min=1024,context_max=2048,topk=8,turn_tokens=16,"
      "pause_steps=20,user_tokens=32,turns=3,shared_prefix_blocks=2,hints=1";
  auto run = [&](const std::string& flags) {
    const ReplayRun r = RunReplay(
        "--attention " + attention + " --block-bytes 64KiB --socket '" + d.socket() + "' " + flags,
        (d.dir() / "replay.json").string());
    EXPECT_EQ(r.status, 0) << r.out;
    return r.json;
  };
  // The daemon's hint counters (status --json): "requests", "unknown_keys".
  auto hint_status = [&](const char* what) {
    const testing::ShellResult r = testing::Shell(std::string(CXLTIERCTL_PATH) + " --socket '" +
                                                  d.socket() + "' status --json");
    const nlohmann::json s = nlohmann::json::parse(r.out, nullptr, false);
    if (s.is_discarded() || !s.contains("hints")) return ~uint64_t{0};
    return s["hints"].value(what, ~uint64_t{0});
  };
  const nlohmann::json quiet = run("--scores flat");
  ASSERT_FALSE(quiet.is_discarded());
  EXPECT_EQ(quiet["scores"], "flat");
  EXPECT_EQ(quiet["hints_sent"], 0u);
  EXPECT_EQ(hint_status("requests"), 0u);
  const nlohmann::json hinted = run("--hints");
  ASSERT_FALSE(hinted.is_discarded());
  EXPECT_EQ(hinted["scores"], "trace");
  const uint64_t sent = hinted["hints_sent"].get<uint64_t>();
  EXPECT_GT(sent, 0u);
  EXPECT_EQ(hinted["hint_failures"], 0u);
  // One request per hint (a group's keys fit one message here), every key
  // one the daemon holds: each hint named its group's live keys.
  EXPECT_EQ(hint_status("requests"), sent);
  EXPECT_EQ(hint_status("unknown_keys"), 0u);
  EXPECT_GT(hint_status("applied"), 0u);  // hints about groups with blocks in them
  // Every step read its touched blocks, and the time is reported.
  EXPECT_GT(hinted["steps"].get<uint64_t>(), 0u);
  EXPECT_GT(hinted["read_s"].get<double>(), 0.0);
  EXPECT_NEAR(hinted["read_us_per_step"].get<double>(),
              1e6 * hinted["read_s"].get<double>() / hinted["steps"].get<double>(), 1e-6);
  EXPECT_TRUE(hinted["cpu"].contains("kdamond_s"));
}

// --warmup: the figures count from the end of the warm-up; a run that ends
// before it measured nothing and fails, saying so.
TEST(Replay, AWarmUpIsLeftOutOfTheFigures) {
  const std::string dir = ::testing::TempDir();
  const std::string attention =
      "steps=160,sessions=4,batch=2,context_min=1024,context_max=2048,topk=8,turn_tokens=16,"
      "pause_steps=20,user_tokens=32,turns=3,shared_prefix_blocks=2";
  // Every node counted fast: an admitted block's pages exist right after
  // its write, so all of them are on a fast node, whatever the machine.
  std::string nodes;
  for (int n = 0; n < 64; ++n) nodes += " " + std::to_string(n);
  auto run = [&](const std::string& flags) {
    return RunReplay("--attention " + attention + " --block-bytes 64KiB --step-ms 5 --fast-nodes" +
                         nodes + " " + flags,
                     dir + "/replay-warmup.json");
  };
  const ReplayRun whole_run = run("");
  const nlohmann::json& whole = whole_run.json;
  ASSERT_FALSE(whole.is_discarded()) << whole_run.out;
  const ReplayRun warm_run = run("--warmup 0.3");
  const nlohmann::json& warm = warm_run.json;
  ASSERT_FALSE(warm.is_discarded()) << warm_run.out;
  EXPECT_LT(warm["touches"].get<uint64_t>(), whole["touches"].get<uint64_t>());
  EXPECT_GT(warm["touches"].get<uint64_t>(), 0u);
  EXPECT_LT(warm["steps"].get<uint64_t>(), whole["steps"].get<uint64_t>());
  EXPECT_LE(warm["measured_s"].get<double>(), warm["seconds"].get<double>() - 0.3);
  EXPECT_GT(warm["admitted_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(warm["admitted_fast_share"].get<double>(), 1.0);
  // The series covers the whole run either way.
  EXPECT_EQ(warm["series"].size(), whole["series"].size());
  const ReplayRun none = run("--warmup 1000 --seconds 0.5");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.out.find("before its --warmup did"), std::string::npos) << none.out;
  // What the daemon is told needs a daemon.
  const ReplayRun flat = run("--scores flat");
  EXPECT_NE(flat.status, 0);
  EXPECT_NE(flat.out.find("need --socket"), std::string::npos) << flat.out;
}

// --step-ms paces the trace's steps, the empty ones too: a recording's idle
// ticks between two turns last as long as they did. And a touch of a block
// touched before counts in the re-touched bytes.
TEST(Replay, EmptyStepsBetweenEventsArePacedToo) {
  const std::string dir = ::testing::TempDir();
  const std::string trace = dir + "/replay-gap.bin";
  // Block 0 touched at steps 0, 1 and 150; block 1 at step 1 only.
  ASSERT_TRUE(sim::SaveTrace(Touches({{0, 0}, {1, 0}, {1, 1}, {150, 0}}, 2), trace).ok());
  std::string nodes;
  for (int n = 0; n < 64; ++n) nodes += " " + std::to_string(n);
  const ReplayRun r =
      RunReplay("--trace 'bin:" + trace + "' --block-bytes 64KiB --step-ms 4 --fast-nodes" + nodes,
                dir + "/replay-gap.json");
  ASSERT_FALSE(r.json.is_discarded()) << r.out;
  EXPECT_EQ(r.json["steps"], 3u);  // the steps with events
  // Steps 0 to 150, 4 ms each at least (a lower bound: sleeps never end early).
  EXPECT_GE(r.json["seconds"].get<double>(), 0.150 * 4);
  EXPECT_EQ(r.json["touches"], 4u);
  EXPECT_EQ(r.json["retouched_bytes"], 2u * 65536);       // block 0's second and third touches
  EXPECT_EQ(r.json["retouched_fast_bytes"], 2u * 65536);  // every node counted fast
}

TEST(Residency, PresentPagesAreOnANodeAndMissingOnesAreUnknown) {
  const long page = sysconf(_SC_PAGESIZE);
  auto* p = static_cast<char*>(
      mmap(nullptr, 8 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, 5 * page);  // five pages exist, three were never touched
  Residency r;
  // Every present page is on some node; which one the test cannot know on
  // every machine, so it asks with every node counted fast, then with none.
  std::vector<int> all;
  for (int n = 0; n < 64; ++n) all.push_back(n);
  const Residency::Count c = r.Query(p, 8 * page, all);
  EXPECT_EQ(c.fast, 5u);
  EXPECT_EQ(c.other, 0u);
  EXPECT_EQ(c.unknown, 3u);
  const Residency::Count none = r.Query(p, 8 * page, {-5});
  EXPECT_EQ(none.fast, 0u);
  EXPECT_EQ(none.other, 5u);
  // Several ranges in one call, each counted on its own: pages 0-1 (both
  // present), 4-5 (one present) and 6-7 (none).
  const std::vector<Residency::Count> many =
      r.QueryMany({p, p + 4 * page, p + 6 * page}, 2 * page, all);
  ASSERT_EQ(many.size(), 3u);
  EXPECT_EQ(many[0].fast, 2u);
  EXPECT_EQ(many[0].unknown, 0u);
  EXPECT_EQ(many[1].fast, 1u);
  EXPECT_EQ(many[1].unknown, 1u);
  EXPECT_EQ(many[2].fast, 0u);
  EXPECT_EQ(many[2].unknown, 2u);
  munmap(p, 8 * page);
}

TEST(Host, VmstatCpuTimeAndFreeMemoryAreRead) {
  const std::map<std::string, uint64_t> vm = ReadVmstat();
  EXPECT_TRUE(vm.count("pgfault")) << "no pgfault in /proc/vmstat";
  EXPECT_GE(ProcessCpuSeconds(getpid()), 0.0);
  EXPECT_LT(ProcessCpuSeconds(999999999), 0.0);  // no such process
  const ZoneMemory z = NodeUserZones(0);
  EXPECT_GT(z.free, 0u);
  EXPECT_GT(z.high, 0u);
  EXPECT_LE(z.above_high, z.free);
  EXPECT_EQ(NodeUserZones(4000).free, 0u);  // no such node
}

// /proc/zoneinfo's shape (6.12, trimmed): what each zone of the node has
// free (its free lists and per-CPU lists) above its high watermark and its
// reserve, and whether kswapd has given the node up. Another node's zones,
// and its state, are not counted.
TEST(Host, ZoneinfoIsReadPerNodeWithItsReserveAndKswapdsState) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::istringstream text(
      "Node 0, zone      DMA\n"
      "  per-node stats\n"
      "      nr_inactive_anon 10\n"
      "  pages free     3000\n"
      "        boost    0\n"
      "        min      10\n"
      "        low      12\n"
      "        high     14\n"
      "        promo    16\n"
      "        protection: (0, 900, 1000, 1000, 1000)\n"
      "  pagesets\n"
      "    cpu: 0\n"
      "              count: 6\n"
      "  node_unreclaimable:  1\n"
      "  start_pfn:           1\n"
      "Node 0, zone    DMA32\n"
      "  pages free     500\n"
      "        min      400\n"
      "        low      450\n"
      "        high     480\n"
      "        protection: (0, 0, 0, 0, 0)\n"
      "  pagesets\n"
      "    cpu: 0\n"
      "              count: 30\n"
      "    cpu: 1\n"
      "              count: 20\n"
      "  node_unreclaimable:  1\n"
      "Node 1, zone  Movable\n"
      "  pages free     99999\n"
      "        high     100\n"
      "  node_unreclaimable:  0\n");
  const ZoneMemory z = ParseZoneinfo(text, 0);
  EXPECT_EQ(z.free, (3000 + 6 + 500 + 30 + 20) * page);
  EXPECT_EQ(z.high, (14 + 480) * page);
  // DMA keeps its high watermark and its largest protection (1000); DMA32
  // has 550 free against a high of 480.
  EXPECT_EQ(z.above_high, ((3006 - 14 - 1000) + (550 - 480)) * page);
  EXPECT_TRUE(z.unreclaimable);

  std::istringstream again(text.str());
  const ZoneMemory other = ParseZoneinfo(again, 1);
  EXPECT_EQ(other.free, 99999 * page);
  EXPECT_FALSE(other.unreclaimable);
}

TEST(Host, AReclaimFromACgroupThatIsNotThereSaysWhy) {
  const std::string err = ReclaimFromCgroup("/sys/fs/cgroup/no-such-cgroup-here", 128 << 10);
  EXPECT_NE(err.find("no-such-cgroup-here/memory.reclaim"), std::string::npos) << err;
}

}  // namespace
}  // namespace cxltier::replay
