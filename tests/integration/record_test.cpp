// Replay of live traffic: a loadgen run recorded with `cxltierctl record`
// and replayed with `cxltier-sim` in tick mode, with the settings the daemon
// ran with and its recorded moves, gives the hits the daemon counted.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cxltier/client.h"
#include "daemon_harness.h"
#include "shell.h"

namespace cxltier {
namespace {

using testing::DaemonProcess;
using testing::Shell;

// Waits (up to `seconds`) for `done`; false if it never came.
template <typename F>
bool WaitFor(F done, int seconds = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

nlohmann::json StatusJson(const std::string& socket) {
  const testing::ShellResult r =
      Shell(std::string(CXLTIERCTL_PATH) + " --socket " + socket + " status --json");
  return nlohmann::json::parse(r.out, nullptr, false);
}

// The daemon's policy in these tests: the default's experts but tinylfu.
// TinyLFU counts touches in a sketch indexed by a hash of each key, and a
// recording holds other keys than the daemon's (hashed with the recording's
// secret): its sketch collides elsewhere in a replay, so the default
// adaptive, which follows a tinylfu expert when that one leads, could part
// from the daemon in the exact replay, by chance of the secret.
constexpr const char* kDaemonConfig =
    "[engine]\ntier0_budget = \"64MiB\"\npolicy = "
    "\"adaptive:sieve+arc+ema:0.05+ema:0.01+lru+s3fifo\"\n";

// Records a `cxltier-loadgen --blocks 256 --steps 600 LOADGEN_FLAGS` run on
// `d` from before its first admit until two ticks after its last release
// (cxltierctl record, stopped by SIGINT): *rec gets its JSON summary,
// *loadgen the loadgen's own.
void RecordLoadgenRun(DaemonProcess& d, const std::string& loadgen_flags, nlohmann::json* rec,
                      nlohmann::json* loadgen) {
  const std::string trace = (d.dir() / "rec.bin").string();
  const std::string summary = (d.dir() / "rec.json").string();
  // The recording runs until SIGINT (cxltierctl's Ctrl-C) once the run is over.
  const testing::ShellResult bg =
      Shell(std::string(CXLTIERCTL_PATH) + " --socket " + d.socket() +
            " record --seconds 3600 --json --out " + trace + " > " + summary + " 2>&1 & echo $!");
  const pid_t ctl = std::stoi(bg.out);
  // Whatever happens below, the recorder does not outlive the test.
  struct KillAtEnd {
    pid_t pid;
    ~KillAtEnd() { kill(pid, SIGKILL); }
  } guard{ctl};
  ASSERT_TRUE(WaitFor([&] { return d.Log().find("recording for") != std::string::npos; }))
      << d.Log() << Slurp(summary);
  const testing::ShellResult lg =
      Shell(std::string(CXLTIER_LOADGEN_PATH) + " --socket " + d.socket() +
            " --blocks 256 --steps 600 " + loadgen_flags + " --json 2>&1");
  ASSERT_EQ(lg.status, 0) << lg.out;
  *loadgen = nlohmann::json::parse(lg.out, nullptr, false);
  ASSERT_FALSE(loadgen->is_discarded()) << lg.out;
  // Everything the loadgen did is folded: it left (its blocks released), and
  // two more ticks ran.
  uint64_t ticks = 0;
  ASSERT_TRUE(WaitFor([&] {
    const nlohmann::json s = StatusJson(d.socket());
    if (s.is_discarded() || s.value("clients", 1) != 0 || s.value("blocks", 1) != 0) return false;
    ticks = s.value("ticks", uint64_t{0});
    return true;
  }));
  ASSERT_TRUE(WaitFor([&] {
    const nlohmann::json s = StatusJson(d.socket());
    return !s.is_discarded() && s.value("ticks", uint64_t{0}) >= ticks + 2;
  }));
  kill(ctl, SIGINT);
  ASSERT_TRUE(WaitFor([&] {
    *rec = nlohmann::json::parse(Slurp(summary), nullptr, false);
    return !rec->is_discarded() && rec->contains("replay");
  })) << Slurp(summary);
  EXPECT_FALSE((*rec)["truncated"].get<bool>());
}

// Runs a replay command cxltierctl record printed (`which`: "replay" or
// "replay_exact") with the build's simulator, `extra` flags and --json;
// returns its rows.
nlohmann::json Replay(const nlohmann::json& rec, const std::string& which,
                      const std::string& extra = "") {
  std::string cmd = rec.value(which, std::string());
  EXPECT_EQ(cmd.rfind("cxltier-sim ", 0), 0u) << which << ": " << rec.dump(2);
  if (cmd.rfind("cxltier-sim ", 0) != 0) return nlohmann::json::array();
  cmd = std::string(CXLTIER_SIM_PATH) + cmd.substr(11) + " " + extra + " --json 2>&1";
  const testing::ShellResult sim = Shell(cmd);
  EXPECT_EQ(sim.status, 0) << cmd << "\n" << sim.out;
  const nlohmann::json rows = nlohmann::json::parse(sim.out, nullptr, false);
  EXPECT_TRUE(rows.is_array()) << cmd << "\n" << sim.out;
  return rows.is_array() ? rows : nlohmann::json::array();
}

// The exact replay of a recording (cxltier-sim --moves recorded) runs the
// engine's plans when the daemon ran them and tells it each move's outcome
// when the daemon's engine was told (a move the mover finished ticks later,
// one that failed, one dispatch refused at once): it is the daemon's run, so
// it gives exactly the touches and the hits the daemon counted live, however
// loaded the machine and late the mover. The what-if replay (--moves
// instant: a plan every tick, every move done at once) is printed beside
// it. Its difference from the live rate is the mover's lag on this machine
// at that moment (0.02 to 3.6 points seen on the 2-core VM), so it is not
// asserted: only its touches are.
TEST(Record, ExactReplayOfALoadgenRunGivesTheDaemonsHits) {
  // 64 MiB of tier 0 = 32 blocks of 2 MiB against the loadgen's 256: blocks must move.
  DaemonProcess d(kDaemonConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  nlohmann::json rec, run;
  ASSERT_NO_FATAL_FAILURE(RecordLoadgenRun(d, "", &rec, &run));
  const uint64_t live_touches = rec["touches"].get<uint64_t>();
  const uint64_t live_hits = rec["hits"].get<uint64_t>();
  ASSERT_GT(live_touches, 1000u) << rec.dump(2);
  // The daemon planned and moved: the recording has its plans and outcomes.
  EXPECT_TRUE(rec["recorded_moves"].get<bool>()) << rec.dump(2);
  EXPECT_GT(rec["plans"].get<uint64_t>(), 0u) << rec.dump(2);
  EXPECT_GT(rec["moves_done"].get<uint64_t>(), 0u) << rec.dump(2);
  ASSERT_TRUE(rec.contains("replay_exact")) << rec.dump(2);
  EXPECT_EQ(rec["replay_exact"].get<std::string>(),
            rec["replay"].get<std::string>() + " --moves recorded");

  const nlohmann::json exact = Replay(rec, "replay_exact");
  ASSERT_EQ(exact.size(), 1u) << exact.dump(2);
  EXPECT_EQ(exact[0]["moves"], "recorded");
  EXPECT_EQ(exact[0]["touches"].get<uint64_t>(), live_touches) << exact[0].dump(2);
  EXPECT_EQ(exact[0]["hits"].get<uint64_t>(), live_hits) << rec.dump(2) << exact[0].dump(2);

  const nlohmann::json what_if = Replay(rec, "replay");
  ASSERT_EQ(what_if.size(), 1u) << what_if.dump(2);
  EXPECT_EQ(what_if[0]["moves"], "instant");
  // Every touch the daemon folded is in the recording, and the replay sees
  // each as one touch.
  EXPECT_EQ(what_if[0]["touches"].get<uint64_t>(), live_touches) << what_if[0].dump(2);
  const double live = 100 * rec["hit_rate"].get<double>();
  std::printf(
      "live %.2f%%, exact replay %.2f%% (%llu of %llu hits), what-if replay %.2f%% (%+.2f "
      "points; %s ticks, %s plans, %s of %s moves done)\n",
      live, 100 * exact[0]["hit_rate"].get<double>(),
      static_cast<unsigned long long>(exact[0]["hits"].get<uint64_t>()),
      static_cast<unsigned long long>(live_hits), 100 * what_if[0]["hit_rate"].get<double>(),
      100 * what_if[0]["hit_rate"].get<double>() - live, rec["ticks"].dump().c_str(),
      rec["plans"].dump().c_str(), rec["moves_done"].dump().c_str(),
      rec["move_outcomes"].dump().c_str());

  // The file holds none of the client's keys. The daemon's key of a block
  // is the client's with its uid mixed into the first half only, so an
  // unhashed key's second half is the loadgen's block index, below 2^32;
  // hashed keys are spread over 128 bits, and a hashed key's second half is
  // below 2^32 with odds of 2^-32. (Asked of either half, below 2^40, the
  // odds were 2^-23 per key, which runs of a few thousand keys meet now and
  // then: the check failed once that way. The first half was no use: the
  // uid's mix makes it large in an unhashed key too.)
  // The header: magic, version, block tokens, key and event counts, and in
  // version 3 (a recording of the daemon's moves) the clock of step 0.
  std::ifstream in((d.dir() / "rec.bin").string(), std::ios::binary);
  char header[40];
  ASSERT_TRUE(in.read(header, 32));
  ASSERT_EQ(std::string(header, 8), "CXLTRACE");
  uint32_t version = 0;
  std::memcpy(&version, header + 8, 4);
  ASSERT_TRUE(version >= 1 && version <= 3) << version;
  if (version == 3) {
    ASSERT_TRUE(in.read(header + 32, 8));
  }
  uint64_t keys = 0;
  std::memcpy(&keys, header + 16, 8);
  ASSERT_EQ(keys, rec["keys"].get<uint64_t>());
  uint64_t small = 0;
  for (uint64_t i = 0; i < keys; ++i) {
    uint64_t hi = 0, lo = 0;
    ASSERT_TRUE(in.read(reinterpret_cast<char*>(&hi), 8) &&
                in.read(reinterpret_cast<char*>(&lo), 8));
    small += lo < (uint64_t{1} << 32);
  }
  EXPECT_EQ(small, 0u) << "keys in the file look like the client's own (version " << version << ")";
}

// A policy that chooses its leader (shards) by miniatures over a sample of
// the keys, keyed by the daemon's secret: the replay, whose keys are hashed
// again, samples others. The recording says where the leader changed
// (kind 9), and the exact replay changes it there instead of choosing, so
// it still gives the daemon's hits. The settings make it change often (a
// 30% sample, no warm-up, any lead); tinylfu, which hashes keys in its own
// sketch, is left out.
TEST(Record, AShardsPolicyReplaysExactlyThroughItsLeaderChanges) {
  DaemonProcess d(
      "[engine]\ntier0_budget = \"64MiB\"\npolicy = "
      "\"shards:lru+lfu+sieve+ema:0.05;rate=0.3;min=1;warm=0;z=0;gain=0;epoch=8;decay=0.5\"\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  nlohmann::json rec, run;
  ASSERT_NO_FATAL_FAILURE(RecordLoadgenRun(d, "", &rec, &run));
  ASSERT_TRUE(rec["recorded_moves"].get<bool>()) << rec.dump(2);
  // It changed its leader during the run (tens of times in every run
  // seen; the sample, and so the count, depends on the daemon's secret).
  std::printf("%s leader changes\n", rec["leader_changes"].dump().c_str());
  EXPECT_GT(rec["leader_changes"].get<uint64_t>(), 1u) << rec.dump(2);
  const nlohmann::json exact = Replay(rec, "replay_exact");
  ASSERT_EQ(exact.size(), 1u) << exact.dump(2);
  EXPECT_EQ(exact[0]["touches"], rec["touches"]) << exact[0].dump(2);
  EXPECT_EQ(exact[0]["hits"], rec["hits"]) << rec.dump(2) << exact[0].dump(2);
  EXPECT_EQ(exact[0]["shards_switches"], rec["leader_changes"]) << exact[0].dump(2);
}

// A run with scheduler hints (cxltier-loadgen --hints) is recorded with its
// hints and groups, and the replays read and apply them: the what-if replay
// with and without them (--hints both: one row each), the exact one with
// them, giving the daemon's hits.
TEST(Record, HintsAreRecordedAndReplayed) {
  DaemonProcess d(kDaemonConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  nlohmann::json rec, run;
  ASSERT_NO_FATAL_FAILURE(RecordLoadgenRun(d, "--hints", &rec, &run));
  const uint64_t sent = run["hints"]["sent"].get<uint64_t>();
  const uint64_t applied = run["hints"]["applied"].get<uint64_t>();
  EXPECT_GT(sent, 10u) << run["hints"].dump();
  EXPECT_GT(applied, 0u) << run["hints"].dump();
  EXPECT_EQ(run["hints"]["keys_unknown"], 0) << run["hints"].dump();
  EXPECT_GT(run["hints"]["keys_grouped"].get<uint64_t>(), 0u) << run["hints"].dump();
  const nlohmann::json live = StatusJson(d.socket());
  EXPECT_EQ(live["hints"]["requests"].get<uint64_t>(), sent) << live["hints"].dump();
  EXPECT_EQ(live["hints"]["applied"].get<uint64_t>(), applied) << live["hints"].dump();
  // Every hint the engine applied is in the recording, and each session's
  // group: one per session the loadgen started at least.
  EXPECT_EQ(rec["hints"].get<uint64_t>(), applied) << rec.dump(2);
  EXPECT_GE(rec["groups"].get<uint64_t>(), 4u) << rec.dump(2);
  std::ifstream in((d.dir() / "rec.bin").string(), std::ios::binary);
  char header[16];
  ASSERT_TRUE(in.read(header, sizeof(header)));
  ASSERT_EQ(std::string(header, 8), "CXLTRACE");
  uint32_t version = 0;
  std::memcpy(&version, header + 8, 4);
  EXPECT_EQ(version, 3u);  // groups, hints and the daemon's moves

  const nlohmann::json rows = Replay(rec, "replay", "--hints both");
  ASSERT_EQ(rows.size(), 2u) << rows.dump(2);
  bool with = false, without = false;
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["touches"].get<uint64_t>(), rec["touches"].get<uint64_t>()) << row.dump(2);
    if (row["hints"].get<bool>()) {
      with = true;
      EXPECT_EQ(row["hint_events"].get<uint64_t>(), applied) << row.dump(2);
    } else {
      without = true;
      EXPECT_EQ(row["hint_events"].get<uint64_t>(), 0u) << row.dump(2);
    }
  }
  EXPECT_TRUE(with && without) << rows.dump(2);
  const nlohmann::json exact = Replay(rec, "replay_exact");
  ASSERT_EQ(exact.size(), 1u) << exact.dump(2);
  EXPECT_EQ(exact[0]["hint_events"].get<uint64_t>(), applied) << exact[0].dump(2);
  EXPECT_EQ(exact[0]["touches"].get<uint64_t>(), rec["touches"].get<uint64_t>());
  EXPECT_EQ(exact[0]["hits"].get<uint64_t>(), rec["hits"].get<uint64_t>())
      << rec.dump(2) << exact[0].dump(2);
  std::printf("with hints: live %.2f%%, exact replay %.2f%%, what-if replay %.2f%% (%llu hints)\n",
              100 * rec["hit_rate"].get<double>(), 100 * exact[0]["hit_rate"].get<double>(),
              100 * (rows[0]["hints"].get<bool>() ? rows[0] : rows[1])["hit_rate"].get<double>(),
              static_cast<unsigned long long>(applied));
}

// A second start while one runs, a stop with none, and bad arguments are
// refused with what to do; the daemon keeps serving.
TEST(Record, RefusesWhatItCannotDo) {
  DaemonProcess d;
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string ctl = std::string(CXLTIERCTL_PATH) + " --socket " + d.socket();
  testing::ShellResult r = Shell(ctl + " record --seconds 1 --out /nonexistent/dir/f.bin 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("/nonexistent/dir/f.bin"), std::string::npos) << r.out;
  std::string text;
  Status st = Client::DaemonAdmin(d.socket(), wire::AdminOp::kRecordStop, "", &text);
  EXPECT_EQ(st.code, wire::ErrorCode::kNotReady) << st.message;
  for (const char* bad : {"", "0", "x", "10:0", "10:99999999999", "99999999", "5:"}) {
    st = Client::DaemonAdmin(d.socket(), wire::AdminOp::kRecordStart, bad, &text);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPayload) << "'" << bad << "': " << st.message;
  }
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kRecordStart, "60", &text).ok());
  st = Client::DaemonAdmin(d.socket(), wire::AdminOp::kRecordStart, "60", &text);
  EXPECT_EQ(st.code, wire::ErrorCode::kBusy) << st.message;
  int fd = -1;
  ASSERT_TRUE(Client::DaemonAdmin(d.socket(), wire::AdminOp::kRecordStop, "", &text, &fd).ok());
  ASSERT_GE(fd, 0);
  // Sealed: the receiver cannot change what the daemon recorded.
  EXPECT_EQ(write(fd, "x", 1), -1);
  close(fd);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["events"], 0);
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace cxltier
