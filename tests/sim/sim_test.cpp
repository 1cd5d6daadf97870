// Traces, the attention workload, and the cxltier-sim command line.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "shell.h"

#include "attention_workload.h"
#include "cxltier/model.h"
#include "simulate.h"
#include "trace.h"

namespace cxltier::sim {
namespace {

// The message of a replay that failed ("" when it succeeded).
std::string ErrorOf(const Result<SimResult>& r) { return r.ok() ? "" : r.status().message; }

const std::string kMooncake = CXLTIER_TEST_DATA "/mooncake_synthetic_trace.jsonl";
const std::string kSim = CXLTIER_SIM_PATH;

using cxltier::testing::Shell;
using cxltier::testing::ShellResult;

std::filesystem::path TempDir() {
  auto d =
      std::filesystem::temp_directory_path() / ("cxltier-sim-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

void ExpectSameTrace(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.block_tokens, b.block_tokens);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    ASSERT_EQ(a.events[i].step, b.events[i].step) << i;
    const EventKind k = a.events[i].kind;
    if (k == EventKind::kPlan || k == EventKind::kHeld || k == EventKind::kLeader ||
        k == EventKind::kHint) {
      ASSERT_EQ(a.events[i].key, b.events[i].key) << i;  // a count, an index: no key
    } else {
      ASSERT_EQ(a.keys[a.events[i].key], b.keys[b.events[i].key]) << i;
    }
    ASSERT_EQ(a.events[i].kind, b.events[i].kind) << i;
    ASSERT_EQ(a.events[i].obs, b.events[i].obs) << i;
  }
}

// ------------------------------------------------------------------ traces

TEST(Mooncake, SampleTraceHasThePublishedCounts) {
  const Result<Trace> r = ReadMooncakeFile(kMooncake);
  ASSERT_TRUE(r.ok()) << r.status().message;
  EXPECT_EQ(r->events.size(), 121877u);
  EXPECT_EQ(r->keys.size(), 43924u);
  EXPECT_EQ(r->events.back().step, 3992u);  // 3,993 requests, one step each
  EXPECT_EQ(r->block_tokens, 512u);
  EXPECT_EQ(r->keys[0], (BlockKey{kMooncakeKeySpace, 0}));
}

TEST(Mooncake, ParsesInOrderAndRejectsBadLines) {
  std::istringstream ok(
      "{\"timestamp\": 0, \"hash_ids\": [5, 6]}\n\n{\"timestamp\": 3, \"hash_ids\": [5]}\n");
  const Result<Trace> r = ReadMooncake(ok, "t");
  ASSERT_TRUE(r.ok()) << r.status().message;
  ASSERT_EQ(r->events.size(), 3u);
  EXPECT_EQ(r->events[0].key, r->events[2].key);
  EXPECT_EQ(r->events[2].step, 1u);
  for (const char* bad : {"{\"hash_ids\": [1, -2]}\n", "not json\n", "{\"timestamp\": 1}\n",
                          "[1,2]\n", "{\"hash_ids\": [1.5]}\n", ""}) {
    std::istringstream in(bad);
    const Result<Trace> b = ReadMooncake(in, "bad");
    EXPECT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message.find("bad"), std::string::npos) << b.status().message;
  }
}

Trace SmallTrace() {
  Trace t;
  t.block_tokens = 16;
  t.keys = {BlockKey{1, 2}, BlockKey{0xffffffffffffffffULL, 0}, BlockKey::FromSequence(9, 9)};
  t.events = {{0, 0, 0.25f, EventKind::kTouch},
              {0, 1, 1e-7f, EventKind::kTouch},
              {3, 0, 0.0f, EventKind::kRelease},
              {3, 2, 123.5f, EventKind::kTouch},
              {4000000000u, 0, 1.0f, EventKind::kTouch}};
  return t;
}

TEST(TraceFormats, BinaryAndCsvRoundTrip) {
  const Trace t = SmallTrace();
  std::stringstream bin;
  ASSERT_EQ(WriteBinary(t, bin).message, "");
  EXPECT_EQ(bin.str().size(), 32 + 16 * t.keys.size() + 16 * t.events.size());
  const Result<Trace> b = ReadBinary(bin, "bin");
  ASSERT_TRUE(b.ok()) << b.status().message;
  ExpectSameTrace(t, *b);

  std::stringstream csv;
  ASSERT_EQ(WriteCsv(t, csv).message, "");
  const Result<Trace> c = ReadCsv(csv, "csv");
  ASSERT_TRUE(c.ok()) << c.status().message;
  ExpectSameTrace(t, *c);
}

TEST(TraceFormats, HostileBinaryInputIsRejectedClearly) {
  std::stringstream good;
  WriteBinary(SmallTrace(), good);
  const std::string bytes = good.str();
  auto read = [](const std::string& b) {
    std::istringstream in(b);
    return ReadBinary(in, "x");
  };
  EXPECT_NE(read(bytes.substr(0, 10)).status().message.find("header"), std::string::npos);
  EXPECT_EQ(read(bytes.substr(0, 10)).status().code, wire::ErrorCode::kBadPayload);
  EXPECT_NE(read("NOTATRACE" + bytes.substr(9)).status().message.find("magic"), std::string::npos);
  EXPECT_NE(read(bytes.substr(0, bytes.size() - 3)).status().message.find("truncated"),
            std::string::npos);
  EXPECT_NE(read(bytes + "x").status().message.find("trailing"), std::string::npos);
  std::string absurd = bytes;
  absurd[31] = '\x7f';  // n_events high byte
  EXPECT_NE(read(absurd).status().message.find("absurd"), std::string::npos);
  std::string version = bytes;
  version[8] = 9;
  EXPECT_NE(read(version).status().message.find("version"), std::string::npos);
  std::string kind = bytes;
  kind[32 + 16 * 3 + 12] = 7;  // first event's kind
  EXPECT_NE(read(kind).status().message.find("kind"), std::string::npos);
  std::string key = bytes;
  key[32 + 16 * 3 + 4] = 99;  // first event's key index
  EXPECT_NE(read(key).status().message.find("out of range"), std::string::npos);
  std::string nan = bytes;
  for (int i = 0; i < 4; ++i) nan[32 + 16 * 3 + 8 + i] = '\xff';
  EXPECT_NE(read(nan).status().message.find("observation"), std::string::npos);
  std::string back = bytes;
  back[32 + 16 * 3 + 16 * 3] = 0;  // fourth event's step 3 -> 0 (< previous)
  EXPECT_NE(read(back).status().message.find("backwards"), std::string::npos);
}

TEST(TraceFormats, BadCsvNamesTheLine) {
  const std::string head = "step,key,kind,obs\n";
  const std::string key = std::string(32, 'a');
  for (const std::string& bad :
       {head + "x," + key + ",touch,1\n", head + "1,zz,touch,1\n", head + "1," + key + ",poke,1\n",
        head + "1," + key + ",touch,abc\n", head + "1," + key + ",touch\n",
        head + "2," + key + ",touch,1\n1," + key + ",touch,1\n", std::string("a,b,c,d\n"),
        "# cxltier-trace v1 block_tokens=0\n" + head}) {
    std::istringstream in(bad);
    const Result<Trace> r = ReadCsv(in, "f.csv");
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message.find("f.csv"), std::string::npos) << r.status().message;
  }
}

TEST(TraceFormats, OpenByPrefixOrExtension) {
  EXPECT_TRUE(OpenTrace("mooncake:" + kMooncake).ok());
  EXPECT_TRUE(OpenTrace(kMooncake).ok());
  const Result<Trace> missing = OpenTrace("bin:/nonexistent/x.bin");
  EXPECT_NE(missing.status().message.find("cannot open"), std::string::npos);
  EXPECT_NE(OpenTrace("/tmp/x.weird").status().message.find("format"), std::string::npos);
  EXPECT_EQ(missing.status().code, wire::ErrorCode::kInternal);
  EXPECT_EQ(OpenTrace("/tmp/x.weird").status().code, wire::ErrorCode::kBadPayload);
}

// ------------------------------------------------------- attention workload

AttentionParams SmallParams() {
  AttentionParams p;
  EXPECT_EQ(p.Parse("steps=300,sessions=6,batch=3,context_min=2048,context_max=8192,topk=16,"
                    "turn_tokens=40,pause_steps=30,user_tokens=64,turns=3,shared_prefix_blocks=4,"
                    "release_on_pause=0.3"),
            "");
  return p;
}

TEST(Attention, DeterministicForASeed) {
  AttentionParams p = SmallParams();
  const Trace a = GenerateAttention(p);
  const Trace b = GenerateAttention(p);
  ExpectSameTrace(a, b);
  p.seed = 2;
  const Trace c = GenerateAttention(p);
  EXPECT_TRUE(a.events.size() != c.events.size() ||
              !std::equal(a.events.begin(), a.events.end(), c.events.begin(),
                          [](const TraceEvent& x, const TraceEvent& y) {
                            return x.key == y.key && x.obs == y.obs;
                          }));
}

TEST(Attention, StepsFollowTheModel) {
  const AttentionParams p = SmallParams();
  const Trace t = GenerateAttention(p);
  EXPECT_EQ(t.Validate().message, "");
  // Per (step, sequence): at most topk touches, masses sum to 1, the sink is among them.
  std::map<std::pair<uint32_t, uint64_t>, std::pair<int, double>> per;
  std::map<std::pair<uint32_t, uint64_t>, bool> sink;
  std::set<BlockKey> released, returned;
  size_t releases = 0;
  for (const TraceEvent& e : t.events) {
    const BlockKey k = t.keys[e.key];
    if (e.kind == EventKind::kRelease) {
      ++releases;
      EXPECT_GE(k.lo, p.shared_prefix_blocks) << "shared prefix blocks are never released";
      released.insert(k);
      continue;
    }
    if (released.count(k)) returned.insert(k);
    // Shared-prefix keys have hi == 0; attribute them by step only.
    auto& [n, mass] = per[{e.step, k.hi}];
    ++n;
    mass += e.obs;
    if (k.lo == 0) sink[{e.step, k.hi}] = true;
  }
  EXPECT_GT(releases, 0u);
  EXPECT_FALSE(returned.empty()) << "release_on_pause should bring released keys back";
  size_t steps_with_touches = 0;
  for (const auto& [key, v] : per) {
    if (key.second == 0) continue;
    EXPECT_LE(v.first, static_cast<int>(p.topk));
    ++steps_with_touches;
  }
  EXPECT_GT(steps_with_touches, 100u);
  // Every sequence touches its sink (block 0, a shared key) every step it decodes.
  std::set<uint32_t> steps;
  for (const TraceEvent& e : t.events) {
    if (e.kind == EventKind::kTouch) steps.insert(e.step);
  }
  for (uint32_t s : steps) EXPECT_TRUE((sink[{s, 0}])) << "step " << s;
}

TEST(Attention, ParseErrorsNameTheParameter) {
  AttentionParams p;
  EXPECT_NE(p.Parse("nope=1").find("unknown attention parameter 'nope'"), std::string::npos);
  EXPECT_NE(p.Parse("steps=abc").find("'steps'"), std::string::npos);
  EXPECT_NE(p.Parse("steps").find("needs =value"), std::string::npos);
  EXPECT_NE(p.Parse("drift=2").find("drift"), std::string::npos);
  EXPECT_NE(p.Parse("context_min=9000,context_max=100").find("context_min"), std::string::npos);
  AttentionParams q;
  EXPECT_EQ(q.Parse("heavy_alpha=0.8,seed=7"), "");
  EXPECT_EQ(q.seed, 7u);
  EXPECT_NE(q.ToString().find("heavy_alpha=0.8"), std::string::npos);
}

// ---------------------------------------------------------------- simulate

TEST(Simulate, MinBeatsEveryPolicyOnTheMooncakeSample) {
  const Result<Trace> r = ReadMooncakeFile(kMooncake);
  ASSERT_TRUE(r.ok());
  const std::vector<uint64_t> next = NextUses(*r);
  for (uint64_t gib : {8, 32, 128}) {
    SimConfig c;
    c.block_bytes = kLlama3_70B.bytes_per_token() * 512;
    c.budget_bytes = gib << 30;
    c.policy = "min";
    const Result<SimResult> min = Simulate(*r, c, &next);
    ASSERT_TRUE(min.ok()) << min.status().message;
    const uint64_t best = min->counters.hits;
    for (const char* p :
         {"lru", "lfu", "ema:0.01", "ema:0.15", "arc", "s3fifo", "sieve", "tinylfu"}) {
      for (auto pers : {engine::Persistence::kPersist, engine::Persistence::kReset}) {
        c.policy = p;
        c.persistence = pers;
        const Result<SimResult> online = Simulate(*r, c, nullptr);
        ASSERT_TRUE(online.ok()) << online.status().message;
        EXPECT_LE(online->counters.hits, best) << p << " " << gib;
      }
    }
  }
}

// Our baselines against libCacheSim (github.com/1a1a11a/libCacheSim, commit
// aa0fc40; S3-FIFO there is by the S3-FIFO authors) on the Mooncake sample,
// one object per 512-token block. The miss ratios are what its cachesim
// printed, from `bash scripts/libcachesim.sh DIR` (docs/policies.md):
//   cachesim mooncake.txt txt <policy> <blocks> --ignore-obj-size 1
// Ours must give the same ratio to its four printed digits. W-TinyLFU is not
// here: libCacheSim's differs from ours (Caffeine's) on purpose, see
// docs/policies.md.
TEST(Simulate, BaselinesEqualLibCacheSimOnTheMooncakeSample) {
  const Result<Trace> r = ReadMooncakeFile(kMooncake);
  ASSERT_TRUE(r.ok());
  struct Row {
    const char* ours;
    uint64_t blocks;
    double miss_ratio;  // libCacheSim's, as printed
  };
  const Row rows[] = {
      {"lru", 51, 0.9977},       {"lru", 204, 0.9877},     {"lru", 819, 0.9277},
      {"lru", 3276, 0.7999},     {"lru", 13107, 0.5164},   {"lfu", 51, 0.9978},
      {"lfu", 204, 0.9940},      {"lfu", 819, 0.9670},     {"lfu", 3276, 0.8640},
      {"lfu", 13107, 0.5515},    {"arc", 51, 0.9958},      {"arc", 204, 0.9855},
      {"arc", 819, 0.9242},      {"arc", 3276, 0.7934},    {"arc", 13107, 0.4927},
      {"sieve", 51, 0.9978},     {"sieve", 204, 0.9940},   {"sieve", 819, 0.9665},
      {"sieve", 3276, 0.8640},   {"sieve", 13107, 0.5515}, {"s3fifo", 51, 0.9967},
      {"s3fifo", 204, 0.9877},   {"s3fifo", 819, 0.9258},  {"s3fifo", 3276, 0.7899},
      {"s3fifo", 13107, 0.5152},
  };
  for (const Row& row : rows) {
    SimConfig c;
    c.block_bytes = kLlama3_70B.bytes_per_token() * 512;
    c.budget_bytes = row.blocks * c.block_bytes;
    c.policy = row.ours;
    c.persistence = engine::Persistence::kReset;
    const Result<SimResult> s_run = Simulate(*r, c, nullptr);
    ASSERT_TRUE(s_run.ok()) << s_run.status().message;
    const SimResult& s = *s_run;
    const double miss =
        1.0 - static_cast<double>(s.counters.hits) / static_cast<double>(r->events.size());
    EXPECT_NEAR(miss, row.miss_ratio, 0.00005) << row.ours << " at " << row.blocks << " blocks";
  }
}

TEST(Simulate, BudgetsAreSizesOrSharesOfTheDistinctBlocks) {
  EXPECT_EQ(BudgetBytes("32GiB", 10, 5), std::optional<uint64_t>(32ull << 30));
  EXPECT_EQ(BudgetBytes("10%", 1000, 4096), std::optional<uint64_t>(100 * 4096));
  EXPECT_EQ(BudgetBytes("0.5%", 1000, 4096), std::optional<uint64_t>(5 * 4096));
  EXPECT_EQ(BudgetBytes("0.01%", 1000, 4096), std::optional<uint64_t>(4096));  // at least one
  EXPECT_EQ(BudgetBytes("100%", 7, 2), std::optional<uint64_t>(14));
  for (const char* bad : {"0%", "101%", "-5%", "x%", "%", "nan%", "5 %", "5%%", "12XB"}) {
    EXPECT_EQ(BudgetBytes(bad, 1000, 4096), std::nullopt) << bad;
  }
}

TEST(Simulate, MinWithoutFutureIsAnError) {
  SimConfig c;
  c.policy = "min";
  const std::string err = ErrorOf(Simulate(SmallTrace(), c, nullptr));
  EXPECT_NE(err.find("future"), std::string::npos);
}

// ---------------------------------------------------------------- the CLI

TEST(SimCli, JsonContract) {
  const ShellResult r = Shell(kSim + " --trace mooncake:" + kMooncake +
                              " --budget 32GiB,8TiB --policy lru,lfu,min --persist both --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u * 3u * 2u);
  for (const auto& row : j) {
    for (const char* k : {"workload", "policy", "persist", "mode", "budget_bytes",
                          "capacity_blocks", "touches", "hits", "hit_rate"}) {
      EXPECT_TRUE(row.contains(k)) << k;
    }
    EXPECT_EQ(row["workload"], "mooncake");
    EXPECT_EQ(row["mode"], "demand");
    EXPECT_EQ(row["touches"], 121877);
    // 160 MiB blocks: 32 GiB holds 204 of them.
    EXPECT_EQ(row["capacity_blocks"], row["budget_bytes"].get<uint64_t>() / (160ull << 20));
    const double rate = row["hit_rate"];
    EXPECT_NEAR(rate, row["hits"].get<double>() / 121877.0, 1e-12);
    EXPECT_GE(rate, 0.0);
    EXPECT_LE(rate, 1.0);
  }
  EXPECT_EQ(j[0]["capacity_blocks"], 204);
  // With an unbounded-looking budget every re-reference hits: 1 - 43924/121877.
  for (const auto& row : j) {
    if (row["budget_bytes"] == (8ull << 40) && row["policy"] == "min") {
      EXPECT_EQ(row["hits"], 121877 - 43924);
    }
  }
}

TEST(SimCli, TableShowsThePersistenceEffect) {
  const ShellResult r = Shell(kSim +
                              " --workload attention:steps=200,sessions=4,batch=2 "
                              "--policy lfu --budget 1GiB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("persistence effect"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lfu"), std::string::npos);
}

TEST(SimCli, ConvertsBetweenFormatsWithoutChangingResults) {
  const auto dir = TempDir();
  const std::string csv = (dir / "m.csv").string(), bin = (dir / "m.bin").string();
  ASSERT_EQ(Shell(kSim + " --trace " + kMooncake + " --write-trace " + csv + " 2>&1").status, 0);
  ASSERT_EQ(Shell(kSim + " --trace csv:" + csv + " --write-trace " + bin + " 2>&1").status, 0);
  const std::string args = " --budget 16GiB --policy lfu,arc --persist both --json";
  const auto a = nlohmann::json::parse(Shell(kSim + " --trace " + kMooncake + args).out);
  const auto b = nlohmann::json::parse(Shell(kSim + " --trace bin:" + bin + args).out);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["hits"], b[i]["hits"]);
  std::filesystem::remove_all(dir);
}

TEST(SimCli, TickModeReportsMigrationBytes) {
  const ShellResult r =
      Shell(kSim +
            " --workload attention:steps=400,sessions=6,batch=3,context_min=4096,"
            "context_max=16384 --policy lfu --persist persist --budget 512MiB --mode tick "
            "--tick-steps 4 --migrate-per-tick 40MiB --hysteresis 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["mode"], "tick");
  EXPECT_GT(j[0]["promoted_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j[0]["demoted_bytes"].get<uint64_t>(), 0u);
  // Never more than 40 MiB per tick.
  EXPECT_LE(j[0]["promoted_bytes"].get<uint64_t>() + j[0]["demoted_bytes"].get<uint64_t>(),
            j[0]["ticks"].get<uint64_t>() * (40ull << 20));
}

// --tiers: three tiers; tier_hits per tier, tier 0 first, tier_hits[0] the
// hits; in demand mode a block's first touch is in no tier, so the tiers add
// up to the touches less the distinct first touches. Tier 0 and 1 together as
// one tier 0 would hit at least what tier 0 and tier 1 hit (rank puts the
// hottest in tier 0), and tick mode places blocks in all three.
TEST(SimCli, TiersGiveEachTiersHits) {
  const std::string w =
      " --workload attention:steps=400,sessions=6,batch=3,context_min=4096,context_max=16384"
      " --policy lru,lfu,default --persist persist --json";
  const ShellResult r = Shell(kSim + w + " --tiers 256MiB,512MiB");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 3u);
  const ShellResult two = Shell(kSim + w + " --budget 256MiB");
  const ShellResult wide = Shell(kSim + w + " --budget 768MiB");
  ASSERT_EQ(two.status, 0);
  ASSERT_EQ(wide.status, 0);
  const auto j2 = nlohmann::json::parse(two.out), jw = nlohmann::json::parse(wide.out);
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& row = j[i];
    ASSERT_EQ(row["tier_hits"].size(), 3u) << row;
    EXPECT_EQ(row["tier_budget_bytes"], (std::vector<uint64_t>{256ull << 20, 512ull << 20}));
    EXPECT_EQ(row["tier_hits"][0], row["hits"]);
    const uint64_t sum = row["tier_hits"][0].get<uint64_t>() + row["tier_hits"][1].get<uint64_t>() +
                         row["tier_hits"][2].get<uint64_t>();
    // Every admission is followed by its first touch, found in no tier.
    EXPECT_EQ(sum, row["touches"].get<uint64_t>() - row["admits"].get<uint64_t>()) << row;
    EXPECT_GT(row["tier_hits"][1].get<uint64_t>(), 0u) << row;
    EXPECT_GT(row["tier_hits"][2].get<uint64_t>(), 0u) << row;
    // Tier 0 is the policy's set whatever lies below: the same hits as with two tiers.
    EXPECT_EQ(row["hits"], j2[i]["hits"]) << row["policy"];
    EXPECT_EQ(j2[i]["tier_hits"].size(), 2u);
    EXPECT_EQ(j2[i]["tier_hits"][0], j2[i]["hits"]);
    // Tiers 0 and 1 hold what one 768 MiB tier 0 would hold, for LRU exactly.
    if (row["policy"] == "lru") {
      EXPECT_EQ(row["tier_hits"][0].get<uint64_t>() + row["tier_hits"][1].get<uint64_t>(),
                jw[i]["hits"].get<uint64_t>());
    }
  }
  const ShellResult tick = Shell(kSim + w + " --tiers 256MiB,512MiB --mode tick --tick-steps 2");
  ASSERT_EQ(tick.status, 0) << tick.out;
  for (const auto& row : nlohmann::json::parse(tick.out)) {
    EXPECT_EQ(row["tier_hits"][0], row["hits"]);
    EXPECT_GT(row["tier_hits"][1].get<uint64_t>(), 0u) << row;
    EXPECT_GT(row["tier_hits"][2].get<uint64_t>(), 0u) << row;
  }
  const ShellResult table = Shell(kSim + w.substr(0, w.size() - 7) + " --tiers 256MiB,512MiB");
  EXPECT_NE(table.out.find("tier 2 rest"), std::string::npos) << table.out;
}

// A recording from a host with three tiers admits blocks where the daemon
// found their pages, tier 2 included; a replay with fewer tiers puts such a
// block in its last.
TEST(Simulate, AdmitsInAThirdTierAreReplayedThere) {
  Trace t;
  t.block_tokens = 16;
  t.keys = {BlockKey{1, 1}, BlockKey{2, 2}, BlockKey{3, 3}};
  t.events = {{0, 0, 2.0f, EventKind::kAdmit}, {0, 1, 1.0f, EventKind::kAdmit},
              {0, 2, 0.0f, EventKind::kAdmit}, {0, 0, 1.0f, EventKind::kTouch},
              {0, 1, 1.0f, EventKind::kTouch}, {0, 2, 1.0f, EventKind::kTouch}};
  ASSERT_EQ(t.Validate().message, "");
  SimConfig c;
  c.mode = engine::Mode::kTick;
  c.block_bytes = 1;
  c.budget_bytes = 1;  // tier 0 holds one block, tier 1 one, tier 2 the rest
  c.lower_budget_bytes = {1};
  const Result<SimResult> three_run = Simulate(t, c, nullptr);
  ASSERT_TRUE(three_run.ok()) << three_run.status().message;
  const SimResult& three = *three_run;
  // Each touch found its block in the tier it was admitted to.
  EXPECT_EQ(three.counters.tier_hits[0], 1u);
  EXPECT_EQ(three.counters.tier_hits[1], 1u);
  EXPECT_EQ(three.counters.tier_hits[2], 1u);
  c.lower_budget_bytes.clear();  // two tiers: tier 2's block is in tier 1
  const Result<SimResult> two_run = Simulate(t, c, nullptr);
  ASSERT_TRUE(two_run.ok()) << two_run.status().message;
  const SimResult& two = *two_run;
  EXPECT_EQ(two.counters.tier_hits[0], 1u);
  EXPECT_EQ(two.counters.tier_hits[1], 2u);
  // Not a tier: past the last one a host can have, or not a whole number.
  for (float bad : {static_cast<float>(kMaxTiers), 1.5f}) {
    Trace b = t;
    b.events[0].obs = bad;
    EXPECT_NE(b.Validate().message.find("an admit's tier must be a whole number, 0 to 7"),
              std::string::npos)
        << bad;
  }
}

// ------------------------------------------------------------ recorded moves

// A daemon in miniature: the engine in tick mode, its moves handed to a
// "mover" that finishes each one to three ticks after its plan (one in five
// not done), one move in ten refused at once (as dispatch refuses what it
// cannot move), plans skipped now and then (the mover busy), blocks released
// while their moves are in flight and admitted again, and now and then a
// block found in the other tier (Relocated). What it tells the engine is
// recorded as the daemon's recorder records it: the plan after the tick's
// touches, an outcome only while the move is still its block's, results
// that come between ticks in the next tick's step.
struct MiniDaemon {
  Trace trace;
  engine::EngineCounters counters;
};

constexpr uint64_t kMiniBudget = 8;  // blocks of 1 byte
constexpr uint64_t kMiniMigrate = 3;
constexpr uint32_t kMiniHysteresis = 2;

// `tiers`: 2, or 3 (tier 1 holds kMiniBudget blocks too). `key_seed`: the
// engine's key hash seed (the daemon's secret; the replay's is 0). A
// policy's leader changes are recorded (kind 9) after the touch that made
// them, as the daemon's fold records them. `start_leader` (shards): the
// leader from the start, recorded as the first event, and never changed.
MiniDaemon RunMiniDaemon(const std::string& policy, uint32_t seed, uint64_t first_tick,
                         unsigned tiers = 2, uint64_t key_seed = 0,
                         std::optional<size_t> start_leader = std::nullopt) {
  engine::EngineOptions o;
  o.key_hash_seed = key_seed;
  o.block_bytes = 1;
  o.tier0_budget_bytes = kMiniBudget;
  if (tiers == 3) o.lower_tier_budget_bytes = {kMiniBudget};
  o.mode = engine::Mode::kTick;
  o.migrate_bytes_per_tick = kMiniMigrate;
  o.hysteresis_ticks = kMiniHysteresis;
  auto made = engine::MakePolicy(policy);
  EXPECT_TRUE(made.ok()) << policy;
  engine::Engine e(o, std::move(*made));
  MiniDaemon out;
  Trace& t = out.trace;
  t.name = "mini";
  t.recorded_moves = true;
  t.first_tick = first_tick;
  constexpr uint32_t kKeys = 48;
  for (uint32_t k = 0; k < kKeys; ++k) t.keys.push_back(BlockKey{7, k});
  std::vector<engine::Slot> slot(kKeys, engine::kNoSlot);
  std::map<engine::Slot, uint32_t> key_of;
  struct InFlight {
    engine::Move move;
    uint32_t key;
    uint32_t due;
    bool done;
  };
  std::vector<InFlight> flight;
  std::mt19937 rng(seed);
  uint64_t leader_changes = 0;
  const auto push = [&t](uint32_t step, uint32_t key, float obs, EventKind kind) {
    t.events.push_back(TraceEvent{step, key, obs, kind});
  };
  if (start_leader) {
    EXPECT_TRUE(e.FollowRecordedLeaders() && e.FollowLeader(*start_leader, /*now=*/true));
    leader_changes = e.policy().LeaderChanges();
    push(0, static_cast<uint32_t>(*start_leader), 0.0f, EventKind::kLeader);
  }
  const auto tell = [&](const InFlight& f, uint32_t step) {
    const BlockState& st = e.state(f.move.slot);
    if (e.IsLive(f.move.slot) && st.generation == f.move.generation &&
        (st.flags & kFlagMigrating)) {
      push(step, f.key, f.done ? 1.0f : 0.0f, EventKind::kOutcome);
    }
    e.Complete(f.move, f.done);
  };
  for (uint32_t step = 1; step <= 400; ++step) {
    // Between ticks: the mover's results, admits, releases, relocations.
    for (auto it = flight.begin(); it != flight.end();) {
      if (it->due > step) {
        ++it;
        continue;
      }
      tell(*it, step);
      it = flight.erase(it);
    }
    for (uint32_t k = 0; k < kKeys; ++k) {
      if (slot[k] == engine::kNoSlot) {
        if (rng() % 4 != 0) continue;
        const unsigned placed = rng() % tiers;
        slot[k] = e.Admit(t.keys[k], TierAt(placed));
        key_of[slot[k]] = k;
        push(step, k, static_cast<float>(placed), EventKind::kAdmit);
      } else if (rng() % 40 == 0) {
        e.Release(slot[k]);
        slot[k] = engine::kNoSlot;
        push(step, k, 0.0f, EventKind::kRelease);
      }
    }
    if (const uint32_t k = rng() % kKeys; rng() % 8 == 0 && slot[k] != engine::kNoSlot) {
      const Tier was = e.state(slot[k]).tier;
      const Tier to = TierAt((TierIndex(was) + 1 + rng() % (tiers - 1)) % tiers);
      e.Relocated(slot[k], to);
      if (e.state(slot[k]).tier != was) {
        push(step, k, static_cast<float>(TierIndex(to)), EventKind::kRelocated);
      }
    }
    // The tick: touches (low keys hotter), then the plan.
    for (int n = 0; n < 12; ++n) {
      const uint32_t k = std::min(rng() % kKeys, rng() % kKeys);
      if (slot[k] == engine::kNoSlot) continue;
      const float obs = static_cast<float>(1 + rng() % 8) / 8.0f;
      e.Touch(slot[k], engine::Touch{obs, first_tick + step, engine::kNever});
      push(step, k, obs, EventKind::kTouch);
      if (e.policy().LeaderChanges() != leader_changes) {
        leader_changes = e.policy().LeaderChanges();
        push(step, static_cast<uint32_t>(e.policy().Leader()), 0.0f, EventKind::kLeader);
      }
    }
    if (rng() % 5 == 0) continue;  // the mover is busy: no plan this tick
    const std::span<const engine::Move> moves = e.Plan();
    push(step, static_cast<uint32_t>(moves.size()), 0.0f, EventKind::kPlan);
    const std::vector<engine::Move> planned(moves.begin(), moves.end());
    for (const engine::Move& m : planned) {
      InFlight f{m, key_of.at(m.slot), step + 1 + static_cast<uint32_t>(rng() % 3), rng() % 5 != 0};
      if (rng() % 10 == 0) {
        f.done = false;  // refused at once
        tell(f, step);
      } else {
        flight.push_back(f);
      }
    }
  }
  out.counters = e.counters();
  return out;
}

SimConfig MiniConfig(const std::string& policy, unsigned tiers = 2) {
  SimConfig c;
  c.policy = policy;
  c.mode = engine::Mode::kTick;
  c.block_bytes = 1;
  c.budget_bytes = kMiniBudget;
  if (tiers == 3) c.lower_budget_bytes = {kMiniBudget};
  c.migrate_bytes_per_tick = kMiniMigrate;
  c.hysteresis_ticks = kMiniHysteresis;
  c.recorded_moves = true;
  return c;
}

// The replay with the recorded moves is the run: every counter the same,
// whatever the lag of each move, whichever failed, for several policies, on
// two tiers and on three.
TEST(RecordedMoves, TheReplayIsTheRunExactly) {
  for (const std::string policy : {"lru", "ema:0.05", "arc", "tinylfu", "adaptive"}) {
    for (uint32_t seed : {1u, 2u, 3u, 4u}) {
      const unsigned tiers = seed % 2 ? 2 : 3;
      const MiniDaemon run = RunMiniDaemon(policy, seed, 1000 * seed, tiers);
      ASSERT_EQ(run.trace.Validate().message, "");
      size_t outcomes = 0, not_done = 0, relocations = 0, plans = 0;
      for (const TraceEvent& ev : run.trace.events) {
        plans += ev.kind == EventKind::kPlan;
        outcomes += ev.kind == EventKind::kOutcome;
        not_done += ev.kind == EventKind::kOutcome && ev.obs == 0.0f;
        relocations += ev.kind == EventKind::kRelocated;
      }
      ASSERT_GT(plans, 100u);
      ASSERT_GT(outcomes, 20u);
      ASSERT_GT(not_done, 2u);
      ASSERT_GT(relocations, 2u);
      if (tiers == 3) {
        ASSERT_GT(run.counters.tier_hits[2], 0u) << policy << " seed " << seed;
      }
      // Through the binary format: version 3 keeps the clock and the moves.
      std::stringstream bin;
      ASSERT_EQ(WriteBinary(run.trace, bin).message, "");
      const Result<Trace> back = ReadBinary(bin, "mini.bin");
      ASSERT_TRUE(back.ok()) << back.status().message;
      const Result<SimResult> r_run = Simulate(*back, MiniConfig(policy, tiers), nullptr);
      ASSERT_TRUE(r_run.ok()) << r_run.status().message << policy << " seed " << seed;
      const SimResult& r = *r_run;
      EXPECT_EQ(r.counters.tier_hits, run.counters.tier_hits) << policy << " seed " << seed;
      const engine::EngineCounters& want = run.counters;
      const engine::EngineCounters& got = r.counters;
      EXPECT_EQ(got.touches, want.touches) << policy << " seed " << seed;
      EXPECT_EQ(got.hits, want.hits) << policy << " seed " << seed;
      EXPECT_EQ(got.promotions, want.promotions) << policy << " seed " << seed;
      EXPECT_EQ(got.demotions, want.demotions) << policy << " seed " << seed;
      EXPECT_EQ(got.failed_moves, want.failed_moves) << policy << " seed " << seed;
      EXPECT_EQ(got.ticks, want.ticks) << policy << " seed " << seed;
      EXPECT_EQ(got.evictions, want.evictions) << policy << " seed " << seed;
      EXPECT_EQ(got.ghost_restores, want.ghost_restores) << policy << " seed " << seed;
    }
  }
}

// A shards policy chooses its leader by miniatures over a sample of the
// keys, keyed by the engine's secret; the replay's is another (0). Told
// where the leader changed (kind 9), the replay changes it there and is
// the run exactly; without those events it parts from the run. A leader
// as the recording's first event is the leader it starts with; a
// candidate the replay's policy lacks is refused.
TEST(RecordedMoves, AShardsPolicysLeaderChangesAreReplayed) {
  const std::string policy =
      "shards:lru+lfu+sieve+ema:0.05;rate=0.5;min=1;warm=0;z=0;gain=0;epoch=4;decay=0.5";
  for (uint32_t seed : {1u, 2u, 3u}) {
    const MiniDaemon run = RunMiniDaemon(policy, seed, 100 * seed, 2, 0x5eed0000 + seed);
    ASSERT_EQ(run.trace.Validate().message, "");
    const size_t changes = std::ranges::count(run.trace.events, EventKind::kLeader,
                                              [](const TraceEvent& ev) { return ev.kind; });
    ASSERT_GT(changes, 10u) << "seed " << seed;
    const Result<SimResult> r = Simulate(run.trace, MiniConfig(policy), nullptr);
    ASSERT_TRUE(r.ok()) << r.status().message << " seed " << seed;
    EXPECT_EQ(r->counters.hits, run.counters.hits) << "seed " << seed;
    EXPECT_EQ(r->counters.evictions, run.counters.evictions) << "seed " << seed;
    EXPECT_EQ(r->counters.promotions, run.counters.promotions) << "seed " << seed;
    EXPECT_EQ(r->shards_switches, changes) << "seed " << seed;
    // Without them the replay chooses nothing, and parts from the run.
    Trace without = run.trace;
    std::erase_if(without.events,
                  [](const TraceEvent& ev) { return ev.kind == EventKind::kLeader; });
    const Result<SimResult> w = Simulate(without, MiniConfig(policy), nullptr);
    EXPECT_TRUE(!w.ok() || w->counters.hits != run.counters.hits ||
                w->counters.evictions != run.counters.evictions)
        << "seed " << seed;
  }
  // The leader at the start: candidate 2 (sieve), with no touch before it.
  const MiniDaemon sieve = RunMiniDaemon(policy, 4, 0, 2, 0x5eed0004, 2);
  Trace t = sieve.trace;
  ASSERT_EQ(t.events.front().kind, EventKind::kLeader);
  const Result<SimResult> started = Simulate(t, MiniConfig(policy), nullptr);
  ASSERT_TRUE(started.ok()) << started.status().message;
  EXPECT_EQ(started->shards_leader, "sieve");
  EXPECT_EQ(started->shards_switches, 1u);
  EXPECT_EQ(started->counters.hits, sieve.counters.hits);
  EXPECT_EQ(started->counters.evictions, sieve.counters.evictions);
  // A candidate it does not have, or a policy with none: at the start, and
  // after a touch.
  t.events.front().key = 4;
  EXPECT_NE(ErrorOf(Simulate(t, MiniConfig(policy), nullptr)).find("no such candidate to follow"),
            std::string::npos);
  t.events.front().key = 0;
  EXPECT_NE(ErrorOf(Simulate(t, MiniConfig("lru"), nullptr)).find("no such candidate to follow"),
            std::string::npos);
  Trace two;
  two.name = "two";
  two.recorded_moves = true;
  two.keys = {BlockKey{7, 1}};
  two.events = {{1, 0, 1.0f, EventKind::kTouch}, {1, 9, 0.0f, EventKind::kLeader}};
  ASSERT_EQ(two.Validate().message, "");
  EXPECT_NE(ErrorOf(Simulate(two, MiniConfig(policy), nullptr)).find("no such candidate to follow"),
            std::string::npos);
  // A change the replay was told of and could not make: no tier 0, so the
  // touch never reaches the policy.
  two.events[1].key = 1;
  SimConfig none = MiniConfig(policy);
  none.budget_bytes = 0;
  EXPECT_NE(ErrorOf(Simulate(two, none, nullptr)).find("did not change its leader"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(Simulate(two, MiniConfig(policy), nullptr)), "");
}

// The what-if replay (--moves instant) skips the recorded moves: it plans
// for itself every tick and completes every move at once, as it did on
// traces without them.
TEST(RecordedMoves, TheWhatIfReplayIgnoresThem) {
  const MiniDaemon run = RunMiniDaemon("lru", 4, 50);
  Trace plain = run.trace;  // the same clock, without the moves
  plain.recorded_moves = false;
  std::erase_if(plain.events, [](const TraceEvent& ev) { return IsMoveEvent(ev.kind); });
  SimConfig c = MiniConfig("lru");
  c.recorded_moves = false;
  const Result<SimResult> with_run = Simulate(run.trace, c, nullptr);
  ASSERT_TRUE(with_run.ok()) << with_run.status().message;
  const SimResult& with = *with_run;
  const Result<SimResult> without_run = Simulate(plain, c, nullptr);
  ASSERT_TRUE(without_run.ok()) << without_run.status().message;
  const SimResult& without = *without_run;
  EXPECT_EQ(with.counters.touches, run.counters.touches);
  EXPECT_EQ(with.counters.hits, without.counters.hits);
  EXPECT_EQ(with.counters.promotions, without.counters.promotions);
  EXPECT_EQ(with.counters.ticks, without.counters.ticks);
  EXPECT_EQ(with.counters.failed_moves, 0u);
  // The recorded replay is the run, failed moves and all.
  const Result<SimResult> exact_run = Simulate(run.trace, MiniConfig("lru"), nullptr);
  ASSERT_TRUE(exact_run.ok()) << exact_run.status().message;
  const SimResult& exact = *exact_run;
  EXPECT_EQ(exact.counters.hits, run.counters.hits);
  EXPECT_EQ(exact.counters.failed_moves, run.counters.failed_moves);
  EXPECT_GT(exact.counters.failed_moves, 0u);
  std::printf("mini daemon: %llu hits of %llu touches; what-if replay %llu\n",
              static_cast<unsigned long long>(run.counters.hits),
              static_cast<unsigned long long>(run.counters.touches),
              static_cast<unsigned long long>(with.counters.hits));
}

// A replay that stops following the recording says where and why; a trace
// without recorded moves, and demand mode, are refused.
TEST(RecordedMoves, ADivergingReplayIsAClearError) {
  const MiniDaemon run = RunMiniDaemon("lru", 5, 0);
  std::string error;
  // One more move than the daemon planned.
  Trace more = run.trace;
  size_t plan = 0;
  while (more.events[plan].kind != EventKind::kPlan || more.events[plan].key == 0) ++plan;
  ++more.events[plan].key;
  error = ErrorOf(Simulate(more, MiniConfig("lru"), nullptr));
  EXPECT_NE(error.find("event " + std::to_string(plan) + " "), std::string::npos) << error;
  EXPECT_NE(error.find("the daemon planned " + std::to_string(more.events[plan].key) +
                       " moves here, the replay " + std::to_string(run.trace.events[plan].key)),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("no longer follows the recording"), std::string::npos) << error;
  // An outcome told twice: the second has no move.
  Trace twice = run.trace;
  size_t outcome = 0;
  while (twice.events[outcome].kind != EventKind::kOutcome) ++outcome;
  const TraceEvent again = twice.events[outcome];
  twice.events.insert(twice.events.begin() + static_cast<long>(outcome) + 1, again);
  error = ErrorOf(Simulate(twice, MiniConfig("lru"), nullptr));
  EXPECT_NE(error.find("event " + std::to_string(outcome + 1) + " "), std::string::npos) << error;
  EXPECT_NE(error.find("has no move of"), std::string::npos) << error;
  // No recorded moves; demand mode; a policy the daemon cannot run.
  Trace old = run.trace;
  std::erase_if(old.events, [](const TraceEvent& ev) { return IsMoveEvent(ev.kind); });
  old.recorded_moves = false;
  error = ErrorOf(Simulate(old, MiniConfig("lru"), nullptr));
  EXPECT_NE(error.find("records no plans or move outcomes"), std::string::npos) << error;
  SimConfig demand = MiniConfig("lru");
  demand.mode = engine::Mode::kDemand;
  error = ErrorOf(Simulate(run.trace, demand, nullptr));
  EXPECT_NE(error.find("needs --mode tick"), std::string::npos) << error;
  const std::vector<uint64_t> future = NextUses(run.trace);
  error = ErrorOf(Simulate(run.trace, MiniConfig("min"), &future));
  EXPECT_NE(error.find("was never the daemon's"), std::string::npos) << error;
}

// Version 3 of the binary format: the clock of step 0 after the header, the
// group table (zeros without groups), kinds 4 to 6, 8 and 9. Older versions may not
// carry those kinds, CSV refuses to drop them, a bad outcome or relocation
// is refused.
TEST(RecordedMoves, BinaryVersionThreeAndWhatReadersRefuse) {
  Trace t = SmallTrace();
  t.recorded_moves = true;
  t.first_tick = 0x123456789abULL;
  t.events.insert(t.events.begin() + 2, {{0, 3, 0.0f, EventKind::kLeader},
                                         {0, 2, 0.0f, EventKind::kPlan},
                                         {1, 1, 1.0f, EventKind::kOutcome},
                                         {1, 0, 1.0f, EventKind::kRelocated},
                                         {1, 2, 0.0f, EventKind::kHeld}});
  ASSERT_EQ(t.Validate().message, "");
  std::stringstream bin;
  ASSERT_EQ(WriteBinary(t, bin).message, "");
  const std::string bytes = bin.str();
  EXPECT_EQ(bytes[8], 3);
  EXPECT_EQ(bytes.size(), 40 + 20 * t.keys.size() + 16 * t.events.size());
  uint64_t clock = 0;
  std::memcpy(&clock, bytes.data() + 32, 8);
  EXPECT_EQ(clock, t.first_tick);
  std::istringstream in(bytes);
  const Result<Trace> r = ReadBinary(in, "v3");
  ASSERT_TRUE(r.ok()) << r.status().message;
  ExpectSameTrace(t, *r);
  EXPECT_TRUE(r->recorded_moves);
  EXPECT_EQ(r->first_tick, t.first_tick);
  EXPECT_TRUE(r->groups.empty());  // the table of zeros reads as none
  // With groups too.
  Trace g = t;
  g.groups = {1, 0, 2};
  std::stringstream gbin;
  ASSERT_EQ(WriteBinary(g, gbin).message, "");
  const Result<Trace> gr = ReadBinary(gbin, "v3g");
  ASSERT_TRUE(gr.ok()) << gr.status().message;
  EXPECT_EQ(gr->groups, g.groups);
  // A kind 4 to 9 in a version 1 trace, and kind 10 in version 3: unknown.
  const size_t first_event = 40 + 20 * t.keys.size();
  std::string v1 = bytes;
  v1[8] = 1;
  v1.erase(32, 8);                        // no clock
  v1.erase(32 + 16 * t.keys.size(), 12);  // no group table
  std::istringstream v1in(v1);
  EXPECT_NE(ReadBinary(v1in, "x").status().message.find("unknown kind 9 for a version 1 trace"),
            std::string::npos);
  std::string ten = bytes;
  ten[first_event + 16 * 2 + 12] = 10;
  std::istringstream sin(ten);
  EXPECT_NE(ReadBinary(sin, "x").status().message.find("unknown kind 10"), std::string::npos);
  // An outcome is 1 or 0; a relocation's tier a whole tier; a plan's
  // budget whole blocks; none of them in a trace that records no moves.
  Trace bad = t;
  bad.events[4].obs = 0.5f;
  EXPECT_NE(bad.Validate().message.find("1 (done) or 0"), std::string::npos);
  bad = t;
  bad.events[5].obs = 9.0f;
  EXPECT_NE(bad.Validate().message.find("a relocation's tier"), std::string::npos);
  bad = t;
  bad.events[3].obs = 1.5f;
  EXPECT_NE(bad.Validate().message.find("a plan's budget"), std::string::npos);
  bad = t;
  bad.events[6].obs = 1.0f;
  EXPECT_NE(bad.Validate().message.find("a held count's observation"), std::string::npos);
  bad = t;
  bad.events[2].obs = 1.0f;
  EXPECT_NE(bad.Validate().message.find("a leader change's observation"), std::string::npos);
  bad = t;
  std::swap(bad.events[2], bad.events[3]);  // after the plan: no touch made it
  EXPECT_NE(bad.Validate().message.find("follows a touch or opens the trace"), std::string::npos);
  bad = t;
  bad.recorded_moves = false;
  EXPECT_NE(bad.Validate().message.find("records no moves"), std::string::npos);
  // CSV carries none: it says so instead of dropping them.
  std::stringstream csv;
  EXPECT_NE(WriteCsv(t, csv).message.find("--moves recorded"), std::string::npos);
}

TEST(SimCli, MovesRecordedNeedsARecording) {
  const std::filesystem::path file = TempDir() / "mini.bin";
  const MiniDaemon run = RunMiniDaemon("lru", 6, 0);
  ASSERT_EQ(SaveTrace(run.trace, file.string()).message, "");
  const std::string replay =
      kSim + " --trace bin:" + file.string() + " --mode tick --block-bytes 1 --budget " +
      std::to_string(kMiniBudget) + " --migrate-per-tick " + std::to_string(kMiniMigrate) +
      " --hysteresis " + std::to_string(kMiniHysteresis) + " --policy lru --persist persist";
  const ShellResult exact = Shell(replay + " --moves recorded --json 2>&1");
  ASSERT_EQ(exact.status, 0) << exact.out;
  const nlohmann::json j = nlohmann::json::parse(exact.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["moves"], "recorded");
  EXPECT_EQ(j[0]["hits"].get<uint64_t>(), run.counters.hits);
  EXPECT_EQ(j[0]["touches"].get<uint64_t>(), run.counters.touches);
  const ShellResult what_if = Shell(replay + " --json 2>&1");
  ASSERT_EQ(what_if.status, 0) << what_if.out;
  EXPECT_EQ(nlohmann::json::parse(what_if.out)[0]["moves"], "instant");
  for (auto [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--trace " + kMooncake + " --mode tick --moves recorded",
            "records no plans or move outcomes"},
           {"--trace bin:" + file.string() + " --moves recorded", "needs --mode tick"},
           {"--trace bin:" + file.string() + " --mode tick --moves later",
            "--moves must be instant or recorded"}}) {
    const ShellResult r = Shell(kSim + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
  }
  // CSV cannot carry the moves: converting says so.
  const ShellResult csv = Shell(kSim + " --trace bin:" + file.string() + " --write-trace " +
                                (TempDir() / "mini.csv").string() + " 2>&1");
  EXPECT_EQ(csv.status, 2) << csv.out;
  EXPECT_NE(csv.out.find("binary format"), std::string::npos) << csv.out;
}

TEST(SimCli, PlotWritesAPng) {
  const auto dir = TempDir();
  const std::string png = (dir / "p.png").string();
  const ShellResult r = Shell(kSim + " --trace " + kMooncake +
                              " --budget 8GiB,32GiB --policy lru,lfu --plot " + png + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(png, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------------ hints

// A small attention workload with hints: four sessions, two at a time.
AttentionParams HintedParams(uint32_t lead) {
  AttentionParams p;
  p.steps = 1200;
  p.sessions = 4;
  p.batch = 2;
  p.context_min = 1024;
  p.context_max = 4096;
  p.topk = 16;
  p.turn_tokens = 32;
  p.pause_steps = 60;
  p.user_tokens = 64;
  p.turns = 4;
  p.shared_prefix_blocks = 4;
  p.hints = 1;
  p.hint_lead = lead;
  return p;
}

TEST(Hints, TheyAddEventsAndGroupsAndChangeNothingElse) {
  AttentionParams p = HintedParams(5);
  const Trace with = GenerateAttention(p);
  p.hints = 0;
  const Trace without = GenerateAttention(p);
  ASSERT_TRUE(with.Validate().ok()) << with.Validate().message;
  EXPECT_TRUE(without.groups.empty());
  ASSERT_EQ(with.groups.size(), with.keys.size());
  std::vector<TraceEvent> rest;
  std::map<std::string, int> kinds;
  for (const TraceEvent& e : with.events) {
    if (e.kind != EventKind::kHint) {
      rest.push_back(e);
      continue;
    }
    ++kinds[e.obs == 1.0f ? "idle" : e.obs == 2.0f ? "soon" : "done"];
  }
  EXPECT_GT(kinds["idle"], 10);
  EXPECT_GT(kinds["soon"], 10);
  EXPECT_GT(kinds["done"], 0);
  // The same touches and releases, in the same order, as without hints.
  Trace stripped = with;
  stripped.events = rest;
  stripped.groups.clear();
  ExpectSameTrace(without, stripped);
  // The shared prefix is in no group; every other key in its session's.
  for (uint32_t k = 0; k < with.keys.size(); ++k) {
    const bool shared = with.keys[k].hi == 0;
    EXPECT_EQ(with.groups[k] == 0, shared) << k;
    if (!shared) {
      EXPECT_EQ(with.groups[k], with.keys[k].hi) << k;
    }
  }
}

TEST(Hints, IdleAfterATurnSoonLeadStepsBeforeTheNext) {
  constexpr uint32_t kLead = 7;
  const Trace t = GenerateAttention(HintedParams(kLead));
  // Per group: the step of its last touch, of its idle hint, of its soon hint.
  struct G {
    int64_t last_touch = -1, idle = -1, soon = -1;
    bool waiting_for_turn = false;
  };
  std::map<uint32_t, G> g;
  int turns_checked = 0;
  for (const TraceEvent& e : t.events) {
    if (e.kind == EventKind::kHint) {
      G& x = g[e.key];
      if (e.obs == 1.0f) {
        EXPECT_EQ(x.last_touch, e.step) << "idle comes in the step its turn ended";
        x.idle = e.step;
        x.soon = -1;
      } else if (e.obs == 2.0f) {
        ASSERT_GE(x.idle, 0) << "soon for a group that was never idle";
        EXPECT_GT(e.step, x.idle);
        x.soon = e.step;
        x.waiting_for_turn = true;
      }
      continue;
    }
    if (e.kind != EventKind::kTouch || t.groups[e.key] == 0) continue;
    G& x = g[t.groups[e.key]];
    if (x.idle >= 0 && x.last_touch == x.idle) {
      // The first touch after an idle hint: its soon came before, kLead steps
      // ahead unless the pause was shorter.
      ASSERT_TRUE(x.waiting_for_turn) << "a turn without its soon hint, group " << t.groups[e.key];
      EXPECT_EQ(static_cast<int64_t>(e.step) - x.soon,
                std::min<int64_t>(kLead, static_cast<int64_t>(e.step) - x.idle - 1));
      x.waiting_for_turn = false;
      ++turns_checked;
    }
    x.last_touch = e.step;
  }
  EXPECT_GT(turns_checked, 10);
}

TEST(Hints, BinaryVersionTwoKeepsGroupsAndHints) {
  const Trace t = GenerateAttention(HintedParams(3));
  std::stringstream bin;
  ASSERT_EQ(WriteBinary(t, bin).message, "");
  const std::string bytes = bin.str();
  EXPECT_EQ(bytes[8], 2);  // version
  EXPECT_EQ(bytes.size(), 32 + 20 * t.keys.size() + 16 * t.events.size());
  std::istringstream in(bytes);
  const Result<Trace> r = ReadBinary(in, "v2");
  ASSERT_TRUE(r.ok()) << r.status().message;
  ExpectSameTrace(t, *r);
  EXPECT_EQ(r->groups, t.groups);
  // Truncated in the group table, a hint of group 0 or of kind 4: refused.
  std::istringstream cut(bytes.substr(0, 32 + 16 * t.keys.size() + 2));
  EXPECT_NE(ReadBinary(cut, "x").status().message.find("group table"), std::string::npos);
  size_t first_hint = 0;
  while (t.events[first_hint].kind != EventKind::kHint) ++first_hint;
  const size_t at = 32 + 20 * t.keys.size() + 16 * first_hint;
  std::string zero = bytes;
  for (int i = 0; i < 4; ++i) zero[at + 4 + i] = 0;
  std::istringstream z(zero);
  EXPECT_NE(ReadBinary(z, "x").status().message.find("group 0"), std::string::npos);
  std::string kind = bytes;
  const float four = 4.0f;
  std::memcpy(&kind[at + 8], &four, 4);
  std::istringstream k(kind);
  EXPECT_NE(ReadBinary(k, "x").status().message.find("hint's kind"), std::string::npos);
  // CSV carries no groups: it says so instead of dropping them.
  std::stringstream csv;
  EXPECT_NE(WriteCsv(t, csv).message.find("binary"), std::string::npos);
}

TEST(Hints, TheSimulatorAppliesThemOnlyWhenAsked) {
  const Trace t = GenerateAttention(HintedParams(4));
  SimConfig c;
  c.policy = "lru";
  c.block_bytes = 1;
  c.budget_bytes = 64;
  c.hints = true;
  const Result<SimResult> on_run = Simulate(t, c, nullptr);
  ASSERT_TRUE(on_run.ok()) << on_run.status().message;
  const SimResult& on = *on_run;
  c.hints = false;
  const Result<SimResult> off_run = Simulate(t, c, nullptr);
  ASSERT_TRUE(off_run.ok()) << off_run.status().message;
  const SimResult& off = *off_run;
  EXPECT_EQ(on.counters.touches, off.counters.touches);
  EXPECT_GT(on.counters.hints, 0u);
  EXPECT_GT(on.counters.hint_displaced, 0u);
  EXPECT_GT(on.counters.hint_prefetched, 0u);
  EXPECT_EQ(off.counters.hints, 0u);
  EXPECT_EQ(off.counters.hint_displaced + off.counters.hint_prefetched, 0u);
  EXPECT_NE(on.counters.hits, off.counters.hits);
}

TEST(SimCli, HintsBothGivesARowEachWay) {
  const std::filesystem::path file = TempDir() / "hinted.bin";
  ASSERT_EQ(SaveTrace(GenerateAttention(HintedParams(4)), file.string()).message, "");
  const ShellResult r = Shell(kSim + " --trace bin:" + file.string() +
                              " --block-bytes 4096 --budget 256KiB --policy adaptive,min"
                              " --persist persist --hints both --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 3u);  // adaptive with and without; MIN once
  std::map<std::pair<std::string, bool>, nlohmann::json> rows;
  for (const auto& row : j) rows[{row["policy"], row["hints"]}] = row;
  ASSERT_EQ(rows.count({"adaptive", true}), 1u);
  ASSERT_EQ(rows.count({"adaptive", false}), 1u);
  const nlohmann::json& with = rows[std::make_pair(std::string("adaptive"), true)];
  const nlohmann::json& without = rows[std::make_pair(std::string("adaptive"), false)];
  const nlohmann::json& min = rows[std::make_pair(std::string("min"), true)];
  EXPECT_GT(with["hint_events"].get<uint64_t>(), 0u);
  EXPECT_EQ(without["hint_events"].get<uint64_t>(), 0u);
  EXPECT_EQ(min["hint_prefetched"].get<uint64_t>(), 0u);
  const ShellResult bad = Shell(kSim + " --trace bin:" + file.string() + " --hints maybe 2>&1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--hints must be"), std::string::npos) << bad.out;
}

TEST(SimCli, BadArgumentsAreClearErrors) {
  for (auto [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--workload attention --policy fifo", "unknown policy 'fifo'"},
           {"--workload attention --budget 12q", "bad budget '12q'"},
           {"--workload attention --persist maybe", "--persist"},
           {"--workload attention --mode lazy", "--mode"},
           {"--workload attention --tiers 1GiB,2x", "bad tier budget '2x'"},
           {"--workload attention --tiers 1GiB --budget 2GiB", "not both"},
           {"--workload attention --tiers 1,2,3,4,5,6,7,8", "--tiers takes 1 to 7"},
           {"--workload attention:bogus=1", "unknown attention parameter"},
           {"--workload zipf", "unknown workload"},
           {"--trace /nonexistent.jsonl", "cannot open"},
           {"", "give --trace or --workload"}}) {
    const ShellResult r = Shell(kSim + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
  }
}

// A flag the trace does not decide is checked before the trace is made: a
// typo fails at once, even with --write-trace, which ran before the checks
// and wrote the whole workload first.
TEST(SimCli, BadFlagsFailBeforeTheTraceIsMade) {
  const auto dir = TempDir();
  const std::string out = (dir / "bad.csv").string();
  for (const char* bad : {"--policy fifo", "--budget 12q", "--mode lazy", "--persist maybe"}) {
    const ShellResult r = Shell(kSim + " --workload attention " + std::string(bad) +
                                " --write-trace " + out + " 2>&1");
    EXPECT_EQ(r.status, 2) << bad << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad << ": the trace was made first";
    std::filesystem::remove(out);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cxltier::sim
