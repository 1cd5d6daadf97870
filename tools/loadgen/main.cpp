// cxltier-loadgen: a real client for demos, tests and benchmarks. It fills a
// pool with a known pattern, admits blocks, drives the attention workload of
// cxltier-sim through the client library, counts live hits, and finally
// verifies every byte of every block.
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <thread>
#include <unordered_map>

#include "attention_workload.h"
#include "copy_mode.h"
#include "cxltier/client.h"
#include "cxltier/model.h"

namespace {

using namespace cxltier;

uint64_t Pattern(uint64_t block, uint64_t word) {
  uint64_t x = (block + 1) * 0x9E3779B97F4A7C15ULL ^ (word * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 29;
  return x;
}

uint64_t PgmigrateSuccess() {
  FILE* f = std::fopen("/proc/vmstat", "r");
  if (!f) return 0;
  char name[128];
  unsigned long long v = 0, found = 0;
  while (std::fscanf(f, "%127s %llu", name, &v) == 2) {
    if (std::strcmp(name, "pgmigrate_success") == 0) found = v;
  }
  std::fclose(f);
  return found;
}

// Open file descriptors of this process, and mappings of state segments:
// what a reconnect must not leak.
size_t CountFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}
size_t CountSegmentMaps() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) n += line.find("cxltier-state") != std::string::npos;
  return n;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cxltier-loadgen: %s\n", msg.c_str());
  return 2;
}

// Set by SIGUSR1 with --until-signal: the workload ends, the checks still run.
volatile sig_atomic_t g_stop_requested = 0;
void RequestStop(int) { g_stop_requested = 1; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltier-loadgen: drive cxltierd with a real pool and the attention workload"};
  std::string socket_path, pool_kind = "memfd", block_bytes_text = "2MiB", name = "loadgen";
  uint32_t blocks = 256, steps = 400, step_ms = 5, sessions = 4, batch = 2;
  double max_seconds = 0;
  uint64_t seed = 1;
  bool json = false, check_placement = false, expect_moves = false, expect_restored = false;
  bool expect_slow_tier = false, expect_kernel_migrations = false, reconnect = false;
  bool expect_no_leaks = false, until_signal = false, pin = false, expect_pinned = false;
  bool hints = false;
  uint32_t expect_tiers = 0;
  uint32_t hint_lead = sim::AttentionParams{}.hint_lead;
  loadgen::CheckOptions checks;  // copy mode's reader and writer threads
  std::string devdax;
  uint64_t until_moves = 0;
  app.add_option("--socket", socket_path, "cxltierd's socket")->required();
  app.add_option("--blocks", blocks, "blocks in the pool")->capture_default_str();
  app.add_option("--block-bytes", block_bytes_text, "bytes per block (a multiple of 8 KiB)")
      ->capture_default_str();
  app.add_option("--pool", pool_kind,
                 "memfd (shared with the daemon), range (this process) or copy (a pool per tier "
                 "from the daemon, blocks moved by copy)")
      ->capture_default_str();
  app.add_flag("--pin", pin,
               "pin the pool(s) with io_uring fixed buffers, the long-term pin cudaHostRegister "
               "takes (copy mode: the kernel's placement of each tier pool is checked before and "
               "after)");
  app.add_option("--readers", checks.readers,
                 "copy mode: threads that Acquire, check and Release blocks all along")
      ->capture_default_str();
  app.add_option("--hold-ticks", checks.hold_ticks,
                 "copy mode: each reader also holds --hold-leases read leases while the daemon "
                 "ticks this many times (moving, releasing and reusing places meanwhile), then "
                 "checks every byte again; a hold ends after max(10 s, 20 times as many "
                 "ticks' time) even if the daemon does not tick (counted, no failure); 0: no "
                 "holds")
      ->capture_default_str();
  app.add_option("--hold-leases", checks.hold_leases,
                 "copy mode: read leases each reader holds at once across --hold-ticks (at most "
                 "31)")
      ->capture_default_str();
  app.add_option("--writers", checks.writers,
                 "copy mode: threads that rewrite live blocks under write leases, each time with "
                 "the next generation (in the block's bytes), first checking the bytes they "
                 "replace; a block the daemon is copying is rewritten at once, at most one a tick "
                 "(the BeginWrite cancels the copy; every other time the write waits until the "
                 "copy is through), and read again two ticks later; 0: blocks are written once")
      ->capture_default_str();
  app.add_option("--rewrite-us", checks.rewrite_us,
                 "copy mode: a writer's pause after rewriting a block the daemon was not copying "
                 "(blocks it is copying are rewritten at once)")
      ->capture_default_str();
  app.add_option(
      "--devdax", devdax,
      "copy mode: the last tier is this device-DAX device (/dev/daxX.Y), mapped by both");
  app.add_flag("--expect-pinned", expect_pinned,
               "page mode: fail unless the daemon reported a pool of this run pinned");
  app.add_option("--steps", steps, "decode steps")->capture_default_str();
  app.add_option("--step-ms", step_ms, "pause between steps")->capture_default_str();
  app.add_option("--seconds", max_seconds,
                 "stop the workload after this long (0: run every step; with --until-moves or "
                 "--until-signal: 120)")
      ->capture_default_str();
  app.add_option("--until-moves", until_moves,
                 "after the --steps, replay the workload (fresh keys each pass) until this run saw "
                 "at least N promotions and N demotions, or --seconds pass; a test that expects "
                 "moves waits for them instead of hoping for them in a fixed number of steps");
  app.add_flag("--until-signal", until_signal,
               "replay the workload (fresh keys each pass) until SIGUSR1 arrives or --seconds "
               "pass, then run the checks and print the summary");
  app.add_flag("--hints", hints,
               "the workload's scheduler hints (attention:hints=1): each session is a group, idle "
               "when its turn ends, done when it ends, soon --hint-lead steps before its next "
               "turn; each is sent as a Hint with the group's live blocks not sent before");
  app.add_option("--hint-lead", hint_lead, "steps a soon hint comes before its turn (--hints)")
      ->capture_default_str();
  app.add_option("--sessions", sessions, "conversations")->capture_default_str();
  app.add_option("--batch", batch, "sequences decoding per step")->capture_default_str();
  app.add_option("--seed", seed, "workload seed")->capture_default_str();
  app.add_option("--name", name, "client name shown by cxltierctl clients");
  app.add_flag("--json", json, "print a JSON summary");
  app.add_flag("--reconnect", reconnect,
               "when the daemon goes away, reconnect (re-register the pool, re-admit every block) "
               "and carry on; copy mode: the tier pools are handed to the new daemon and every "
               "block is admitted again where it is, the reader and writer threads wait at safe "
               "points meanwhile (readers keep the leases of their holds, which must read back "
               "the same bytes after it; no writer holds a write lease) and carry on with the "
               "blocks' new slots");
  app.add_flag("--expect-no-leaks", expect_no_leaks,
               "fail unless the file descriptors and mapped state segments at the end are what "
               "they were after the first connect");
  app.add_flag("--check-placement", check_placement,
               "at the end, ask the kernel (move_pages) where every live block's pages are and "
               "fail if that disagrees with the tier the daemon published");
  app.add_flag("--expect-moves", expect_moves,
               "fail unless blocks were both demoted and promoted (at least --until-moves of each "
               "when given)");
  app.add_flag("--expect-restored", expect_restored,
               "fail unless some admitted keys got their ghost state back");
  app.add_flag("--expect-slow-tier", expect_slow_tier,
               "fail unless the daemon reports a slow tier with at least one node");
  app.add_option("--expect-tiers", expect_tiers,
                 "with --check-placement: fail unless the daemon has at least N tiers and, "
                 "at the check, blocks the kernel shows on each of tiers 0 .. N-1's nodes "
                 "(with --until-moves, the run also goes on until live blocks sit in each once the "
                 "daemon is quiet)");
  app.add_flag("--expect-kernel-migrations", expect_kernel_migrations,
               "fail unless /proc/vmstat pgmigrate_success grew during the run");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto bb = ParseSize(block_bytes_text);
  if (!bb || *bb == 0 || *bb % 8192 != 0 || *bb > (1ull << 32)) {
    return Fail("--block-bytes must be a positive multiple of 8 KiB (up to 4 GiB)");
  }
  if (pool_kind != "memfd" && pool_kind != "range" && pool_kind != "copy") {
    return Fail("--pool must be memfd, range or copy");
  }
  const bool copy = pool_kind == "copy";
  if (blocks < 8 || sessions == 0 || batch == 0)
    return Fail("need --blocks >= 8 and sessions, batch >= 1");
  if ((until_moves > 0 || until_signal) && max_seconds <= 0) max_seconds = 120;
  if (until_signal) {
    // SA_RESTART, and the library retries on EINTR: the signal never fails a call.
    struct sigaction sa {};
    sa.sa_handler = RequestStop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);
  }

  // A geometry whose block is exactly --block-bytes: one KV head of dim 128, fp16.
  ModelGeometry model{"loadgen", static_cast<uint32_t>(*bb / 8192), 1, 1, 128, 2, 16};
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t stride = (*bb + page - 1) / page * page;
  const uint64_t length = stride * blocks;

  // The pool. THP off: a huge page spanning two blocks would make them move together.
  int memfd = -1;
  void* pool = MAP_FAILED;
  if (copy) {
    pool = nullptr;  // the daemon makes the pools
  } else if (pool_kind == "memfd") {
    memfd = memfd_create("cxltier-loadgen-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0 || ftruncate(memfd, static_cast<off_t>(length)) != 0) return Fail("memfd");
    pool = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  } else {
    pool = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (pool == MAP_FAILED) return Fail("cannot map a pool of " + FormatBytes(length));
  auto* words = static_cast<uint64_t*>(pool);
  const uint64_t words_per_block = *bb / 8;
  if (!copy) {
    madvise(pool, length, MADV_NOHUGEPAGE);
    for (uint64_t b = 0; b < blocks; ++b) {
      uint64_t* w = words + b * (stride / 8);
      for (uint64_t i = 0; i < words_per_block; ++i) w[i] = Pattern(b, i);
    }
  }

  Status st;
  // Copy mode: a place (and a slot, after a reconnect: the library's parked
  // key) is kept for every lease a hold has on a block that moved or was
  // released, beyond the blocks live at once: that room is ours to give.
  const uint32_t held_room = copy ? static_cast<uint32_t>(checks.readers) * checks.hold_leases : 0;
  auto client = Client::Connect({socket_path, model, blocks + held_room, name}, &st);
  if (!client) return Fail(st.message);
  // The daemon's tiers: which nodes the kernel should show each tier's pages
  // on. slow_nodes: those of every tier but 0.
  std::vector<std::vector<int>> tier_nodes;
  std::vector<int> fast_nodes, slow_nodes;
  {
    std::string text;
    if (client->Stats("tiers", &text).ok()) {
      const nlohmann::json t = nlohmann::json::parse(text, nullptr, false);
      if (t.is_array()) {
        for (const auto& tier : t) {
          const size_t k = tier["tier"].get<size_t>();
          if (k >= kMaxTiers) continue;
          if (tier_nodes.size() <= k) tier_nodes.resize(k + 1);
          for (const auto& n : tier["nodes"]) {
            tier_nodes[k].push_back(n["node"].get<int>());
            (k == 0 ? fast_nodes : slow_nodes).push_back(n["node"].get<int>());
          }
        }
      }
    }
  }
  tier_nodes.resize(std::max<size_t>(tier_nodes.size(), 2));
  auto nodes_of = [&](uint8_t t) -> const std::vector<int>& {
    static const std::vector<int> kNone;
    return t < tier_nodes.size() ? tier_nodes[t] : kNone;
  };
  // Device-DAX memory is no node's: the kernel cannot say where it is.
  auto kernel_knows = [&](uint8_t t) { return devdax.empty() || t + 1u < client->tiers(); };
  uint32_t pool_id = 0;
  loadgen::Pin pins;
  uint64_t off_node_before_pin = 0, off_node_after_pin = 0;
  if (copy) {
    Client::TierPoolOptions o;
    o.blocks = blocks + held_room;
    o.devdax_path = devdax;
    st = client->CreateTierPools(o);
    if (!st.ok()) return Fail("tier pools: " + st.message);
    pool_id = client->tier_pool(0);
    for (uint8_t t = 0; t < client->tiers(); ++t) {
      if (!kernel_knows(t)) continue;
      off_node_before_pin += loadgen::PagesOffNodes(client->tier_pool_base(t),
                                                    client->tier_pool_bytes(t), nodes_of(t));
    }
  } else {
    st = pool_kind == "memfd" ? client->RegisterMemfdPool(memfd, length, stride, blocks, &pool_id)
                              : client->RegisterRangePool(pool, length, stride, blocks, &pool_id);
    if (!st.ok()) return Fail("register pool: " + st.message);
  }
  if (pin) {
    std::string err;
    if (copy) {
      for (uint8_t t = 0; t < client->tiers(); ++t) {
        if (t + 1u == client->tiers() && !devdax.empty()) {
          // io_uring pins only anonymous, shmem and hugetlb memory (cudaHostRegister pins
          // device-DAX too); the device is never migratable memory anyway.
          std::fprintf(stderr,
                       "cxltier-loadgen: the device-DAX pool is not pinned (io_uring "
                       "refuses file-backed memory)\n");
          continue;
        }
        if (!pins.Add(client->tier_pool_base(t), client->tier_pool_bytes(t), &err)) {
          return Fail("pinning the tier " + std::to_string(t) + " pool: " + err);
        }
        if (!kernel_knows(t)) continue;
        off_node_after_pin += loadgen::PagesOffNodes(client->tier_pool_base(t),
                                                     client->tier_pool_bytes(t), nodes_of(t));
      }
    } else if (!pins.Add(pool, length, &err)) {
      return Fail("pinning the pool: " + err);
    }
  }
  std::unique_ptr<loadgen::Readers> readers;
  if (copy) readers = std::make_unique<loadgen::Readers>(*client, *bb, checks);
  const size_t fds_at_start = CountFds(), segments_at_start = CountSegmentMaps();

  // Every call to the daemon goes through here: with --reconnect, a failed
  // call waits for the daemon to come back, reconnects and is tried again.
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> live;  // trace key -> (block, slot)
  std::vector<BlockKey> trace_keys;                                  // filled once the trace exists
  // --hints: trace keys already sent to the daemon with a hint of their group
  // (it keeps them in the group until they are released).
  std::vector<uint8_t> hint_sent;
  uint64_t reconnects = 0, restored_on_reconnect = 0;
  auto call = [&](const std::function<Status()>& fn) -> Status {
    Status s = fn();
    if (s.ok() || !reconnect) return s;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    // Copy mode: no Reader may be used and no write lease taken or ended
    // while Reconnect runs; the threads wait at safe points (readers holding
    // the leases of their holds, across it) until their slots are remapped.
    if (readers) readers->Pause();
    while (std::chrono::steady_clock::now() < give_up) {
      uint64_t restored_now = 0;
      if (client->Reconnect(&restored_now).ok()) {
        ++reconnects;
        restored_on_reconnect += restored_now;
        for (auto& [key, v] : live) client->SlotOf(trace_keys[key], &v.second);
        if (readers) {
          readers->Remap();
          readers->Resume();
          // Leases held across it on blocks released or moved before it
          // keep slots (the library's parked keys) until they end: wait for
          // that, so that an Admit sized to our free slots fits.
          readers->WaitParked();
        }
        // A new daemon knows no groups: the next hints send their keys again.
        std::fill(hint_sent.begin(), hint_sent.end(), 0);
        s = fn();
        // A daemon stopping (SIGTERM) may still take a connection before it
        // goes: then the call fails again on the socket, and the next daemon
        // is awaited. Any answer of a daemon is the call's.
        if (s.ok() || s.code != wire::ErrorCode::kInternal) return s;
        if (readers) readers->Pause();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (readers) readers->Resume();
    return s;
  };

  // The daemon's migration totals before we start, to report our run's share.
  auto migrations = [&client, &call]() {
    std::string text;
    if (!call([&] { return client->Stats("status", &text); }).ok()) {
      return nlohmann::json::object();
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("migrations")) return nlohmann::json::object();
    // The daemon's hint counters too, beside the migration ones.
    nlohmann::json m = j["migrations"];
    if (j.contains("hints")) {
      m["hint_prefetched"] = j["hints"].value("prefetched", uint64_t{0});
      m["hint_displaced"] = j["hints"].value("displaced", uint64_t{0});
    }
    return m;
  };
  const nlohmann::json mig_before = migrations();
  // This run's share of a daemon counter (other clients may share the daemon).
  auto moved = [&mig_before](const nlohmann::json& now, const char* k) -> uint64_t {
    return now.value(k, uint64_t{0}) -
           std::min(now.value(k, uint64_t{0}), mig_before.value(k, uint64_t{0}));
  };
  auto moves_seen = [&] {
    const nlohmann::json now = migrations();
    return moved(now, "promotions") >= until_moves && moved(now, "demotions") >= until_moves;
  };
  // Waits until the daemon is quiet: nothing pending and no move completed
  // across three ticks (blocks held by hysteresis may still move after we stop).
  auto wait_quiet = [&] {
    for (int wait = 0; wait < 600; ++wait) {
      const nlohmann::json a = migrations();
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * client->tick_ms() + 10));
      const nlohmann::json b = migrations();
      if (b.value("pending", uint64_t{1}) == 0 &&
          a.value("promotions", 0) == b.value("promotions", 0) &&
          a.value("demotions", 0) == b.value("demotions", 0) &&
          a.value("failed", 0) == b.value("failed", 0)) {
        return true;
      }
    }
    return false;
  };
  auto tiers_seen = [&] {
    std::vector<bool> seen(expect_tiers, false);
    for (const auto& [k, v] : live) {
      const size_t t = TierIndex(client->TierOf(v.second));
      if (t < seen.size()) seen[t] = true;
    }
    return std::find(seen.begin(), seen.end(), false) == seen.end();
  };
  // With --expect-tiers, --until-moves also waits until the daemon has
  // published live blocks in each of the tiers checked at the end: where a
  // pass stops decides how many blocks are live, and too few fit in the
  // upper tiers. The tiers are checked on the quiet daemon: with no new
  // touches a settling daemon may promote a lower tier's last blocks, and
  // then the run goes on (quiet_rounds counts the times).
  uint64_t quiet_rounds = 0;
  auto until_met = [&] {
    if (!moves_seen()) return false;
    if (expect_tiers == 0) return true;
    if (!tiers_seen()) return false;
    if (!check_placement) return true;
    wait_quiet();
    if (tiers_seen()) return true;
    ++quiet_rounds;
    return false;
  };
  const uint64_t pgmigrate_before = PgmigrateSuccess();

  // The attention workload, sized so every live key fits the pool.
  sim::AttentionParams p;
  p.seed = seed;
  p.steps = steps;
  p.sessions = sessions;
  p.batch = batch;
  p.block_tokens = model.block_tokens;
  // Each session's share of the pool less two blocks, at least 4 (a pool
  // smaller than its sessions need drops the touches past it).
  const uint32_t share = blocks / std::max<uint32_t>(1, sessions);
  const uint32_t per_session = std::max<uint32_t>(4, share > 2 ? share - 2 : 0);
  p.context_max = per_session * p.block_tokens;
  p.context_min = std::max<uint32_t>(p.block_tokens, p.context_max / 2);
  p.shared_prefix_blocks = 0;
  p.topk = std::min<uint32_t>(16, per_session);
  p.turn_tokens = 32;
  p.pause_steps = 40;
  p.user_tokens = p.block_tokens * 2;
  p.hints = hints ? 1 : 0;
  p.hint_lead = hint_lead;
  if (std::string err = p.Validate(); !err.empty()) return Fail("workload: " + err);
  const sim::Trace trace = sim::GenerateAttention(p);
  trace_keys = trace.keys;
  if (trace.events.empty()) return Fail("workload: the trace is empty");
  // Each group's keys (Trace::groups), for the hints.
  std::unordered_map<uint32_t, std::vector<uint32_t>> group_keys;
  if (hints) {
    for (uint32_t k = 0; k < trace.groups.size(); ++k) {
      if (trace.groups[k] != 0) group_keys[trace.groups[k]].push_back(k);
    }
    hint_sent.assign(trace.keys.size(), 0);
  }
  uint64_t hints_sent = 0, hints_applied = 0, hint_keys_grouped = 0, hint_keys_unknown = 0;
  uint64_t hint_events_skipped = 0;
  // One hint event: a Hint for its group with the group's live keys not sent
  // before (computed at the call, so a retry after a reconnect sends them all).
  auto send_hint = [&](const sim::TraceEvent& e) -> Status {
    const auto members = group_keys.find(e.key);
    return call([&] {
      std::vector<uint32_t> sending;
      std::vector<BlockKey> keys;
      if (members != group_keys.end()) {
        for (uint32_t k : members->second) {
          if (hint_sent[k] || !live.contains(k)) continue;
          sending.push_back(k);
          keys.push_back(trace_keys[k]);
        }
      }
      wire::HintOk ok;
      Status s = client->Hint(e.key, static_cast<HintKind>(static_cast<int>(e.obs)), keys, &ok);
      if (s.ok()) {
        for (uint32_t k : sending) hint_sent[k] = 1;
        ++hints_sent;
        hints_applied += ok.applied;
        hint_keys_grouped += ok.grouped;
        hint_keys_unknown += ok.unknown;
      }
      return s;
    });
  };

  std::vector<uint32_t> free_blocks;
  for (uint32_t b = blocks; b-- > 0;) free_blocks.push_back(b);
  uint64_t touches = 0, hits = 0, dropped = 0, admitted = 0, released = 0, restored = 0;
  size_t i = 0;
  uint64_t passes = 1;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (i == trace.events.size()) {
      // The trace is done. Replay it while a --until-* condition is not met:
      // release every live block and give the next pass fresh keys (no ghost
      // of this run comes back, as in a pass of new conversations).
      const bool replay = until_signal ? !g_stop_requested : until_moves > 0 && !until_met();
      if (!replay) break;
      std::vector<BlockKey> all;
      for (const auto& [key, v] : live) {
        all.push_back(trace_keys[key]);
        free_blocks.push_back(v.first);
        if (readers) readers->Withdraw(v.second);
      }
      live.clear();
      for (size_t from = 0; from < all.size(); from += 256) {
        const std::vector<BlockKey> part(all.begin() + from,
                                         all.begin() + std::min(all.size(), from + 256));
        if (Status r = call([&] { return client->Release(part); }); !r.ok()) {
          return Fail("release: " + r.message);
        }
      }
      released += all.size();
      for (size_t k = 0; k < trace_keys.size(); ++k) {
        trace_keys[k] = trace.keys[k];
        trace_keys[k].hi ^= passes << 40;  // sequence ids of the trace stay far below 2^40
      }
      std::fill(hint_sent.begin(), hint_sent.end(), 0);  // released: out of their groups
      ++passes;
      i = 0;
    }
    if (g_stop_requested) break;
    if (max_seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >=
            max_seconds) {
      break;
    }
    const uint32_t step = trace.events[i].step;
    if (until_moves > 0 && passes > 1 && step % 25 == 0 && until_met()) break;
    size_t end = i;
    while (end < trace.events.size() && trace.events[end].step == step) ++end;
    // Admit this step's new keys in one batch, release the released ones.
    std::vector<wire::AdmitEntry> admit;
    std::vector<uint32_t> admit_keys, admit_blocks;
    std::vector<BlockKey> release;
    for (size_t k = i; k < end; ++k) {
      const sim::TraceEvent& e = trace.events[k];
      // Admitted at its first touch here; hints go with the touches below;
      // a recording's plans and moves are its daemon's, not ours to replay.
      if (e.kind != sim::EventKind::kTouch && e.kind != sim::EventKind::kRelease) continue;
      auto it = live.find(e.key);
      if (e.kind == sim::EventKind::kRelease) {
        if (it != live.end()) {
          release.push_back(trace_keys[e.key]);
          if (!hint_sent.empty()) hint_sent[e.key] = 0;  // a released block leaves its group
          free_blocks.push_back(it->second.first);
          if (readers) readers->Withdraw(it->second.second);
          live.erase(it);
        }
      } else if (it == live.end() &&
                 std::find(admit_keys.begin(), admit_keys.end(), e.key) == admit_keys.end()) {
        if (free_blocks.empty()) continue;
        // Copy mode: the daemon places the block; our index only counts room.
        admit.push_back({trace_keys[e.key], copy ? 0 : free_blocks.back()});
        admit_blocks.push_back(free_blocks.back());
        admit_keys.push_back(e.key);
        free_blocks.pop_back();
      }
    }
    if (!release.empty()) {
      if (Status r = call([&] { return client->Release(release); }); !r.ok()) {
        return Fail("release: " + r.message);
      }
      released += release.size();
    }
    if (!admit.empty()) {
      std::vector<wire::AdmitResult> results;
      if (Status a = call([&] { return client->Admit(pool_id, admit, &results); }); !a.ok()) {
        return Fail("admit: " + a.message);
      }
      if (readers) readers->Admitted();
      for (size_t k = 0; k < admit.size(); ++k) {
        live[admit_keys[k]] = {copy ? admit_blocks[k] : admit[k].block_index, results[k].slot};
        restored += results[k].restored;
        if (!copy) continue;
        // The daemon placed it and gave us its write lease: fill it, let go.
        uint8_t* at = client->WriteAddress(results[k].slot);
        if (!at) return Fail("admitted slot " + std::to_string(results[k].slot) + " has no place");
        loadgen::FillBlock(at, *bb, admit[k].key);
        if (Status w = client->EndWrite(results[k].slot); !w.ok()) return Fail(w.message);
        readers->Publish(results[k].slot, admit[k].key);
      }
      admitted += admit.size();
    }
    // Touches and hints in the trace's order: the daemon folds this client's
    // observations before it applies a hint, so a hint after a touch comes
    // after it there too.
    for (size_t k = i; k < end; ++k) {
      const sim::TraceEvent& e = trace.events[k];
      if (e.kind == sim::EventKind::kHint) {
        if (!hints) {
          ++hint_events_skipped;
          continue;
        }
        if (Status h = send_hint(e); !h.ok()) return Fail("hint: " + h.message);
        continue;
      }
      if (e.kind != sim::EventKind::kTouch) continue;
      auto it = live.find(e.key);
      if (it == live.end()) {
        ++dropped;
        continue;
      }
      ++touches;
      hits += client->TierOf(it->second.second) == Tier::kFast;
      client->Observe(it->second.second, e.obs);
    }
    i = end;
    // A heartbeat: notices a daemon that went away even in steps without calls.
    if (reconnect && step % 25 == 0) {
      std::string text;
      if (Status h = call([&] { return client->Stats("status", &text); }); !h.ok()) {
        return Fail("daemon gone: " + h.message);
      }
    }
    if (step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  // Let the daemon fold the last observations and finish its moves.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * client->tick_ms() + 50));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  uint64_t blocks_fast = 0, blocks_slow = 0;
  for (const auto& [k, v] : live) {
    const Tier t = client->TierOf(v.second);
    blocks_fast += t == Tier::kFast;
    blocks_slow += t != Tier::kFast && t != Tier::kNone;  // any tier below 0
  }

  // Where the kernel says each live block's pages are, against the tier the
  // daemon published (never our own bookkeeping).
  uint64_t placement_checked = 0, placement_mismatches = 0, kernel_fast = 0, kernel_slow = 0;
  std::vector<uint64_t> kernel_by_tier(tier_nodes.size(), 0);  // blocks all on their tier's nodes
  const bool same_nodes = fast_nodes == slow_nodes;  // a one-node test setup: no way to tell
  if (check_placement) {
    if (!wait_quiet()) {
      std::fprintf(stderr,
                   "cxltier-loadgen: the daemon kept moving blocks; placement checked anyway\n");
    }
    for (const auto& [k, v] : live) {
      const Tier published = client->TierOf(v.second);
      std::vector<void*> pages;
      uint8_t* base = static_cast<uint8_t*>(pool) + uint64_t{v.first} * stride;
      if (copy) {  // where the daemon published the block to be
        const Location at = client->LocationOf(v.second);
        base = at.tier < kMaxTiers ? client->tier_pool_base(at.tier) + uint64_t{at.index} * stride
                                   : nullptr;
        if (!base || static_cast<uint8_t>(client->TierOf(v.second)) != at.tier) {
          ++placement_mismatches;
          continue;
        }
        if (!kernel_knows(at.tier)) {  // in the device: what the daemon published is all we know
          ++placement_checked;
          continue;
        }
      }
      for (uint64_t off = 0; off < *bb; off += page) pages.push_back(base + off);
      std::vector<int> status(pages.size(), -1);
      const long rc = numa_move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0);
      const int call_errno = rc < 0 ? errno : 0;
      size_t on_fast = 0, on_slow = 0, on_published = 0;
      std::map<int, size_t> seen;  // node (or -errno) -> pages, for the report
      const std::vector<int>& published_nodes = nodes_of(static_cast<uint8_t>(published));
      for (int n : status) {
        on_fast += std::count(fast_nodes.begin(), fast_nodes.end(), n) > 0;
        on_slow += std::count(slow_nodes.begin(), slow_nodes.end(), n) > 0;
        on_published += std::count(published_nodes.begin(), published_nodes.end(), n) > 0;
        ++seen[n];
      }
      ++placement_checked;
      const bool all_fast = on_fast == pages.size(), all_slow = on_slow == pages.size();
      kernel_fast += all_fast;
      kernel_slow += all_slow && !same_nodes;
      // Every page on the nodes of the tier the daemon published (tier 1
      // and below: that tier's own nodes, not just any slow node).
      const bool ok = same_nodes ? (all_fast && published != Tier::kNone)
                                 : (published != Tier::kNone && on_published == pages.size());
      if (ok && !same_nodes && TierIndex(published) < kernel_by_tier.size()) {
        ++kernel_by_tier[TierIndex(published)];
      }
      if (!ok) {
        if (placement_mismatches < 5) {
          std::fprintf(stderr,
                       "cxltier-loadgen: block %u published %s (tier %u) but the kernel has %zu "
                       "pages on fast nodes, %zu on slow nodes and %zu on its tier's of %zu\n",
                       v.first,
                       published == Tier::kFast   ? "fast"
                       : published == Tier::kNone ? "none"
                                                  : "slow",
                       TierIndex(published), on_fast, on_slow, on_published, pages.size());
          // What the kernel said instead: node ids, or -errno per page (-2: not
          // present, -14: not mapped), and the call's own error (then every
          // page still shows the -1 it was given before the call).
          std::string said;
          for (auto [n, count] : seen)
            said += " " + std::to_string(n) + "x" + std::to_string(count);
          std::fprintf(stderr, "cxltier-loadgen:   move_pages said:%s%s%s\n", said.c_str(),
                       call_errno ? "; the call failed: " : "",
                       call_errno ? std::strerror(call_errno) : "");
        }
        ++placement_mismatches;
      }
    }
  }
  const uint64_t pgmigrate = PgmigrateSuccess() - std::min(PgmigrateSuccess(), pgmigrate_before);

  // Every byte of every block, whatever moved (copy mode: of the generation
  // last written; an older one is a lost write or a stale copy published).
  uint64_t corrupt = 0, verified = 0, stale = 0;
  loadgen::CheckCounts seen;
  if (copy) {
    readers->Stop();
    seen = readers->counts();
    auto reader = client->NewReader(&st);
    if (!reader) return Fail(st.message);
    for (const auto& [k, v] : live) {
      Client::Reader::Lease lease;
      if (!reader->Acquire(v.second, &lease).ok()) {
        ++corrupt;
        continue;
      }
      uint64_t generation = 0;
      const uint64_t want = readers->generation(v.second);
      const bool whole = loadgen::BlockIntact(lease.data, *bb, &trace_keys[k], &generation);
      corrupt += !whole || generation != want;
      stale += whole && generation < want;
      ++verified;
      (void)reader->Release(lease);
    }
  } else {
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t* w = words + b * (stride / 8);
      ++verified;
      for (uint64_t k = 0; k < words_per_block; ++k) {
        if (w[k] != Pattern(b, k)) {
          ++corrupt;
          break;
        }
      }
    }
  }
  const nlohmann::json mig_after = migrations();
  auto delta = [&](const char* k) { return moved(mig_after, k); };
  auto copies_in = [](const nlohmann::json& m) {
    return m.contains("copy") ? m["copy"].value("copies", uint64_t{0}) : uint64_t{0};
  };
  const uint64_t copies =
      copies_in(mig_after) - std::min(copies_in(mig_after), copies_in(mig_before));
  // This run's share of a counter of the daemon's copy mode.
  auto copy_counter = [&](const char* k) {
    auto in = [k](const nlohmann::json& m) {
      return m.contains("copy") ? m["copy"].value(k, uint64_t{0}) : uint64_t{0};
    };
    return in(mig_after)-std::min(in(mig_after), in(mig_before));
  };
  nlohmann::json out = {
      {"touches", touches},
      {"hits", hits},
      {"hit_rate", touches ? static_cast<double>(hits) / touches : 0.0},
      {"admitted", admitted},
      {"released", released},
      {"dropped_touches", dropped},
      {"bytes_promoted", delta("promoted_bytes")},
      {"bytes_demoted", delta("demoted_bytes")},
      {"promotions", delta("promotions")},
      {"demotions", delta("demotions")},
      {"migration_failures", delta("failed")},
      {"restored", restored},
      {"reconnects", reconnects},
      {"restored_on_reconnect", restored_on_reconnect},
      {"fd_growth", static_cast<int64_t>(CountFds()) - static_cast<int64_t>(fds_at_start)},
      {"state_segments_mapped", CountSegmentMaps()},
      {"placement_checked", placement_checked},
      {"placement_mismatches", placement_mismatches},
      {"kernel_blocks_fast", kernel_fast},
      {"kernel_blocks_slow", kernel_slow},
      {"kernel_blocks_by_tier", kernel_by_tier},
      {"tier_nodes", tier_nodes},
      {"slow_nodes", slow_nodes},
      {"pgmigrate_success", pgmigrate},
      {"live_blocks_fast", blocks_fast},
      {"live_blocks_slow", blocks_slow},
      {"blocks_verified", verified},
      {"corrupt_blocks", corrupt},
      {"stale_blocks", stale},
      {"torn_reads", readers ? readers->bad_reads() : 0},
      {"lease_reads", seen.reads},
      {"reader_failures", seen.failed},
      {"lease_checks",
       {{"torn", seen.torn},
        {"stale", seen.stale},
        {"changed_while_held", seen.changed},
        {"holds", seen.holds},
        {"holds_cut_short", seen.holds_cut_short},
        {"held_blocks_moved", seen.held_moved},
        {"held_blocks_released", seen.held_released},
        {"held_across_reconnect", seen.held_across_reconnect},
        {"rewrites", seen.rewrites},
        {"rewrites_over_copy", seen.rewrites_over_copy},
        {"copies_dropped_written", copy_counter("dropped_written")},
        {"hold_ticks", checks.hold_ticks},
        {"hold_leases", checks.hold_leases},
        {"readers", checks.readers},
        {"writers", checks.writers}}},
      {"pinned", pin},
      {"pool_pages_off_node_before_pin", off_node_before_pin},
      {"pool_pages_off_node_after_pin", off_node_after_pin},
      {"pools_pinned", delta("pools_pinned")},
      {"copies", copies},
      {"block_bytes", *bb},
      {"pool", pool_kind},
      {"seconds", seconds},
      {"passes", passes},
      {"quiet_rounds", quiet_rounds},
      {"hints",
       {{"sent", hints_sent},
        {"applied", hints_applied},
        {"keys_grouped", hint_keys_grouped},
        {"keys_unknown", hint_keys_unknown},
        {"events_skipped", hint_events_skipped},
        {"blocks_prefetched", delta("hint_prefetched")},
        {"blocks_displaced", delta("hint_displaced")}}},
  };
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << fmt::format(
        "cxltier-loadgen: {} touches, {} hits ({:.1f}%), {} admitted, {} released\n"
        "  moved: {} promoted, {} demoted ({} failed moves)\n"
        "  now: {} live blocks in tier 0, {} in slower tiers\n"
        "  verified {} blocks of {}: {} corrupt\n",
        touches, hits, touches ? 100.0 * hits / touches : 0.0, admitted, released,
        FormatBytes(out["bytes_promoted"].get<uint64_t>()),
        FormatBytes(out["bytes_demoted"].get<uint64_t>()),
        out["migration_failures"].get<uint64_t>(), blocks_fast, blocks_slow, verified,
        FormatBytes(*bb), corrupt);
    if (hints) {
      std::cout << fmt::format(
          "  hints: {} sent ({} applied), {} blocks prefetched, {} displaced\n", hints_sent,
          hints_applied, out["hints"]["blocks_prefetched"].get<uint64_t>(),
          out["hints"]["blocks_displaced"].get<uint64_t>());
    }
    if (copy) {
      std::cout << fmt::format(
          "  copy mode: {} reads under leases, {} torn, {} stale, {} failed\n"
          "  {} leases held {} ticks ({} of moved blocks, {} of released ones, {} across a "
          "reconnect): {} changed\n"
          "  {} rewrites ({} over a copy): {} stale blocks at the end\n",
          seen.reads, seen.torn, seen.stale, seen.failed, seen.holds, checks.hold_ticks,
          seen.held_moved, seen.held_released, seen.held_across_reconnect, seen.changed,
          seen.rewrites, seen.rewrites_over_copy, stale);
    }
  }
  std::vector<std::string> failed;
  if (corrupt) {
    failed.push_back(std::to_string(corrupt) + " corrupt blocks (" + std::to_string(stale) +
                     " of an older generation than the last write)");
  }
  if (readers && readers->bad_reads()) {
    failed.push_back(fmt::format(
        "{} torn reads under leases: {} not whole, {} of an older generation than the last "
        "write, {} held leases whose bytes changed while held",
        readers->bad_reads(), seen.torn, seen.stale, seen.changed));
  }
  if (readers && readers->failed()) {
    failed.push_back(std::to_string(readers->failed()) + " reader failures (" +
                     readers->first_error() + ")");
  }
  if (copy && check_placement && !same_nodes && (off_node_before_pin || off_node_after_pin)) {
    failed.push_back(fmt::format(
        "tier pool pages off their tier's nodes: {} before pinning, {} after (pinning memory that "
        "is onlined movable migrates it: online CXL memory with --no-movable)",
        off_node_before_pin, off_node_after_pin));
  }
  if (expect_pinned) {
    // Moves come back on the daemon's time: wait for its word, up to 60 s.
    bool said = out["pools_pinned"].get<uint64_t>() > 0;
    for (int wait = 0; wait < 600 && !said; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      said = moved(migrations(), "pools_pinned") > 0;
    }
    if (!said) {
      failed.push_back("expected the daemon to report the pinned pool (migrations.pools_pinned)");
    }
  }
  if (check_placement && placement_mismatches) {
    failed.push_back(std::to_string(placement_mismatches) + " blocks not where the daemon says");
  }
  const uint64_t want_moves = std::max<uint64_t>(1, until_moves);
  if (expect_moves && (out["demotions"].get<uint64_t>() < want_moves ||
                       out["promotions"].get<uint64_t>() < want_moves)) {
    failed.push_back(
        fmt::format("expected at least {} demotions and {} promotions, saw {} and {} "
                    "in {:.1f} s ({} passes)",
                    want_moves, want_moves, out["demotions"].get<uint64_t>(),
                    out["promotions"].get<uint64_t>(), seconds, passes));
  }
  if (expect_restored && restored + restored_on_reconnect == 0) {
    failed.push_back("expected ghosts to be restored");
  }
  if (expect_no_leaks && (out["fd_growth"] != 0 || CountSegmentMaps() != segments_at_start)) {
    failed.push_back("leaked: " + out["fd_growth"].dump() + " more fds, " +
                     std::to_string(CountSegmentMaps()) + " state segments mapped (" +
                     std::to_string(segments_at_start) + " at start)");
  }
  if (expect_slow_tier && slow_nodes.empty()) failed.push_back("the daemon reports no slow tier");
  if (expect_tiers > 0) {
    size_t reported = 0;
    for (const std::vector<int>& nodes : tier_nodes) reported += !nodes.empty();
    if (!check_placement || reported < expect_tiers) {
      failed.push_back("expected " + std::to_string(expect_tiers) +
                       " tiers with nodes, the daemon reports " + std::to_string(reported) +
                       (check_placement ? "" : " (and --expect-tiers needs --check-placement)"));
    } else {
      for (uint32_t k = 0; k < expect_tiers; ++k) {
        if (kernel_by_tier[k] == 0) {
          failed.push_back("no block the kernel shows on tier " + std::to_string(k) + "'s nodes");
        }
      }
    }
  }
  if (hint_keys_unknown) {
    failed.push_back(std::to_string(hint_keys_unknown) +
                     " keys of our hints were unknown to the daemon (we held them)");
  }
  if (expect_kernel_migrations && pgmigrate == 0) {
    failed.push_back("pgmigrate_success did not grow");
  }
  for (const std::string& f : failed)
    std::fprintf(stderr, "cxltier-loadgen: CHECK FAILED: %s\n", f.c_str());
  return failed.empty() ? 0 : 1;
}
