// cxltier-replay: one arm of the comparison with the kernel's own tiering
// (docs/comparison.md). It replays a block trace against real memory: a pool
// of blocks in this process, each admitted block written, each touched block
// read (by the CPU, or by a device through O_DIRECT), and, before every
// touch, the kernel asked where the block's pages are. Whoever tiers the
// memory (nobody, the kernel, or cxltierd through --socket) is set up outside;
// this tool measures what they achieved and what it cost, the same way in
// every arm.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "attention_workload.h"
#include "cxltier/client.h"
#include "cxltier/model.h"
#include "fit.h"
#include "host.h"
#include "trace.h"

namespace {

using namespace cxltier;
using Clock = std::chrono::steady_clock;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cxltier-replay: %s\n", msg.c_str());
  return 2;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double RusageSeconds(const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; }

// What the end of the warm-up asks the pool's cgroup to reclaim when kswapd
// has given node 0 up: 32 pages, the least one reclaim pass takes
// (SWAP_CLUSTER_MAX).
constexpr uint64_t kReviveBytes = 128 << 10;

// The bytes of an admitted block: a function of its key, so a block read back
// after any number of moves can be checked.
uint64_t Word(const BlockKey& key, uint64_t i) {
  uint64_t x = (key.hi ^ (key.lo * 0x9E3779B97F4A7C15ULL)) + i * 0xC2B2AE3D27D4EB4FULL;
  return x ^ (x >> 31);
}

// The guest-sized default: 8 sessions of 4K to 8K tokens (256 to 512 blocks
// each), a third of paused sessions freeing their blocks (they come back by
// key), 4 sequences decoding per step over 32 blocks each.
constexpr const char* kDefaultAttention =
    "steps=3000,sessions=8,batch=4,context_min=4096,context_max=8192,topk=32,turn_tokens=128,"
    "pause_steps=200,user_tokens=256,turns=4,shared_prefix_blocks=16,release_on_pause=0.3";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cxltier-replay: replay a block trace against real memory and measure where the "
      "touched bytes were (one arm of docs/comparison.md)"};
  std::string trace_spec, attention = kDefaultAttention, write_trace, block_text = "64KiB";
  std::string arm = "unnamed", access = "cpu", device, socket_path, json_path, fast_free_text = "0";
  std::string device_io_text = "0", scores = "trace", pool_cgroup;
  bool send_hints = false;
  std::vector<int> fast_nodes = {0};
  uint32_t pool_blocks = 0, step_ms = 0, intervals = 40;
  double max_seconds = 0, warmup_seconds = 0;
  pid_t daemon_pid = 0;
  auto* trace_opt =
      app.add_option("--trace", trace_spec, "trace file: mooncake:FILE, bin:FILE, csv:FILE");
  app.add_option("--attention", attention, "or the attention workload, k=v,... (cxltier-sim's)")
      ->capture_default_str()
      ->excludes(trace_opt);
  app.add_option("--pool-blocks", pool_blocks,
                 "blocks in the pool; when a block must be admitted into a full pool the least "
                 "recently touched one is released (0: as many as the trace keeps live)");
  app.add_option("--write-trace", write_trace,
                 "write the trace fitted to --pool-blocks (FILE.bin or FILE.csv) and exit: the "
                 "file every arm and cxltier-sim replay");
  app.add_option("--block-bytes", block_text, "bytes per block, a multiple of 4 KiB")
      ->capture_default_str();
  app.add_option("--arm", arm, "the arm's name, recorded in the output")->capture_default_str();
  app.add_option("--access", access,
                 "cpu (the CPU reads every byte of a touched block) or device (the block is "
                 "written to --device with O_DIRECT: the device reads it by DMA)")
      ->capture_default_str();
  app.add_option("--device", device, "block device (or file) for --access device");
  app.add_option("--device-io", device_io_text,
                 "bytes per device write, a multiple of 4 KiB dividing the block (0: the block; "
                 "the cxl guest needs 4KiB: QEMU 7.2 bounces a device's access to its emulated "
                 "CXL memory through one page-sized buffer)")
      ->capture_default_str();
  app.add_option("--fast-nodes", fast_nodes, "the fast tier's nodes")->capture_default_str();
  app.add_option("--fast-free", fast_free_text,
                 "lock memory on the first fast node until only this much is free above its "
                 "high watermark (the same fast-tier capacity in every arm); 0: no balloon")
      ->capture_default_str();
  app.add_option("--cgroup", pool_cgroup,
                 "a cgroup (v2) directory to move into once the balloon is sized, before the "
                 "pool is mapped: the pool's pages are charged there, ours and the balloon's where "
                 "we started (so that a DAMOS memcg filter can leave those alone)");
  app.add_option("--socket", socket_path,
                 "cxltierd's socket: register the pool, admit, observe and release through the "
                 "client library (the cxltier arms)");
  app.add_option("--scores", scores,
                 "with --socket: trace (each touch observed with the trace's score) or flat "
                 "(every touch observed with 1: the daemon learns touches only)")
      ->capture_default_str();
  app.add_flag("--hints", send_hints,
               "with --socket: send the trace's scheduler hints (idle, soon, done of a group, "
               "with the group's live keys)");
  app.add_option("--daemon-pid", daemon_pid, "cxltierd's pid, for its CPU time");
  app.add_option("--step-ms", step_ms,
                 "each step lasts at least this long, and so do the steps with no event before the "
                 "next (a recording's idle ticks)")
      ->capture_default_str();
  app.add_option("--intervals", intervals, "points of the fast-tier share over time")
      ->capture_default_str();
  app.add_option("--seconds", max_seconds, "stop after this long (0: the whole trace)");
  app.add_option("--warmup", warmup_seconds,
                 "seconds of warm-up: the measured figures count from its end (touches, "
                 "shares, steps, read time, where admissions were written, the kernel's and "
                 "the daemon's moves, CPU, client calls, the steady pool bytes); the series, "
                 "the counts of admissions, releases, restores and hints, and every failure "
                 "cover the whole run");
  app.add_option("--json", json_path, "write the result here (default: stdout)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto block = ParseSize(block_text);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (!block || *block == 0 || *block % page != 0 || *block > (1ull << 32)) {
    return Fail("--block-bytes must be a positive multiple of the page size, up to 4 GiB");
  }
  const auto fast_free = ParseSize(fast_free_text);
  if (!fast_free) return Fail("bad --fast-free '" + fast_free_text + "'");
  if (access != "cpu" && access != "device") return Fail("--access must be cpu or device");
  if (access == "device" && device.empty()) return Fail("--access device needs --device");
  const auto device_io_arg = ParseSize(device_io_text);
  const uint64_t device_io = device_io_arg && *device_io_arg ? *device_io_arg : *block;
  if (!device_io_arg || device_io % 4096 != 0 || *block % device_io != 0) {
    return Fail("--device-io must be a multiple of 4 KiB that divides --block-bytes");
  }
  if (scores != "trace" && scores != "flat") return Fail("--scores must be trace or flat");
  const bool flat_scores = scores == "flat";
  if ((send_hints || flat_scores) && socket_path.empty()) {
    return Fail("--hints and --scores flat are about what the daemon is told: they need --socket");
  }
  if (!(warmup_seconds >= 0)) return Fail("--warmup must be 0 or more seconds");
  if (fast_nodes.empty()) return Fail("--fast-nodes needs a node");
  if (intervals == 0) intervals = 1;

  // ---- the trace, fitted to the pool ----
  auto raw = std::make_unique<sim::Trace>();
  if (!trace_spec.empty()) {
    Result<sim::Trace> r = sim::OpenTrace(trace_spec);
    if (!r.ok()) return Fail(r.status().message);
    *raw = std::move(*r);
  } else {
    sim::AttentionParams p;
    if (std::string err = p.Parse(attention); !err.empty()) return Fail(err);
    if (std::string err = p.Validate(); !err.empty()) return Fail(err);
    *raw = sim::GenerateAttention(p);
    // As the readers check a file's trace (a hint's kind is 1 to 3, among others).
    if (Status st = raw->Validate(); !st.ok()) return Fail("the generated trace: " + st.message);
  }
  if (raw->events.empty()) return Fail("the trace is empty");
  replay::FitStats fit_stats;
  if (pool_blocks == 0) {
    replay::FitToPool(*raw, UINT32_MAX, &fit_stats);
    pool_blocks = std::max<uint32_t>(1, fit_stats.max_live);
  }
  const sim::Trace trace = replay::FitToPool(*raw, pool_blocks, &fit_stats);
  raw.reset();  // nothing of it is needed again: no memory of ours beyond what every arm has
  if (!write_trace.empty()) {
    if (Status st = sim::SaveTrace(trace, write_trace); !st.ok()) return Fail(st.message);
    const nlohmann::json j = {{"trace", write_trace},
                              {"events", trace.events.size()},
                              {"touches", trace.touches()},
                              {"keys", trace.keys.size()},
                              {"block_tokens", trace.block_tokens},
                              {"pool_blocks", pool_blocks},
                              {"max_live", fit_stats.max_live},
                              {"admissions", fit_stats.admissions},
                              {"readmissions", fit_stats.readmissions},
                              {"forced_releases", fit_stats.forced_releases}};
    std::cout << j.dump() << "\n";
    return 0;
  }

  // ---- device, daemon, capacity, pool (in that order) ----
  int dev = -1;
  uint64_t dev_slots = 0;
  if (access == "device") {
    dev = open(device.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (dev < 0) return Fail(device + ": " + std::strerror(errno));
    const off_t size = lseek(dev, 0, SEEK_END);
    dev_slots = size > 0 ? static_cast<uint64_t>(size) / *block : 0;
    if (dev_slots == 0) return Fail(device + " is smaller than one block");
  }
  std::unique_ptr<Client> client;
  uint32_t pool_id = 0;
  nlohmann::json daemon_before = nlohmann::json::object();
  auto daemon_status = [&]() -> nlohmann::json {
    std::string text;
    if (!client || !client->Stats("status", &text).ok()) return nlohmann::json::object();
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  };
  if (!socket_path.empty()) {
    if (*block % 8192 != 0) return Fail("with --socket, --block-bytes must be a multiple of 8 KiB");
    ModelGeometry model{"replay", static_cast<uint32_t>(*block / 8192), 1, 1, 128, 2, 16};
    Status st;
    client = Client::Connect({socket_path, model, pool_blocks, "replay-" + arm}, &st);
    if (!client) return Fail(st.message);
  }
  // Everything of ours but the pool stays where it is: locked before the
  // balloon is sized, so that no arm's kswapd can demote it and free node 0
  // for the pool (the pool, mapped after, is not locked).
  const bool locked = mlockall(MCL_CURRENT) == 0;
  if (!locked) {
    std::fprintf(stderr, "cxltier-replay: mlockall: %s (our own memory may be demoted)\n",
                 std::strerror(errno));
  }
  // The cgroup we started in (cgroup v2: "0::/PATH"), where the balloon's
  // pages are charged.
  std::string home_cgroup;
  {
    std::ifstream self("/proc/self/cgroup");
    for (std::string line; std::getline(self, line);) {
      if (line.rfind("0::", 0) == 0) home_cgroup = "/sys/fs/cgroup" + line.substr(3);
    }
  }
  auto join = [](const std::string& dir) {
    std::ofstream procs(dir + "/cgroup.procs");
    procs << getpid() << std::endl;
    return static_cast<bool>(procs);
  };
  replay::Balloon balloon;
  replay::ZoneMemory fast_at_start;
  // Sized, then checked once we are in the pool's cgroup: others (cxltierd,
  // the kernel) may allocate on the node meanwhile, and a cxltierd arm once
  // started 2.8 MiB short of its room. A few rounds, the balloon grown in its
  // own cgroup each time.
  for (int round = 0; round < 5; ++round) {
    if (round > 0 && !pool_cgroup.empty() && !home_cgroup.empty() && !join(home_cgroup)) {
      return Fail("cannot move back into the cgroup " + home_cgroup);
    }
    if (*fast_free > 0) {
      if (std::string err = balloon.Inflate(fast_nodes.front(), *fast_free); !err.empty()) {
        return Fail(err);
      }
    }
    if (!pool_cgroup.empty() && !join(pool_cgroup)) {
      return Fail("cannot move into the cgroup " + pool_cgroup);
    }
    fast_at_start = replay::NodeUserZones(fast_nodes.front());
    const uint64_t slack = replay::Balloon::Slack(*fast_free);
    const uint64_t got = fast_at_start.above_high;
    if (*fast_free == 0 || (got + slack >= *fast_free && got <= *fast_free + slack)) break;
  }
  const uint64_t stride = *block;
  const uint64_t length = stride * pool_blocks;
  auto* pool = static_cast<uint8_t*>(
      mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (pool == MAP_FAILED) return Fail("cannot map a pool of " + FormatBytes(length));
  // THP off: a huge page spanning blocks would make them move together. Pages
  // come at admission, where the kernel's first touch puts them.
  madvise(pool, length, MADV_NOHUGEPAGE);
  if (client) {
    Status st = client->RegisterRangePool(pool, length, stride, pool_blocks, &pool_id);
    if (!st.ok()) return Fail("register pool: " + st.message);
    daemon_before = daemon_status();
  }

  // ---- the replay ----
  replay::Residency where;
  // The kernel's tiering threads: kswapd (reclaim, which demotes) and
  // kdamond (DAMON's, when a DAMOS scheme migrates).
  const std::vector<pid_t> kswapd = replay::FindProcesses("kswapd");
  const std::vector<pid_t> kdamond = replay::FindProcesses("kdamond");
  auto cpu_of = [](const std::vector<pid_t>& pids) {
    double s = 0;
    for (pid_t p : pids) s += std::max(0.0, replay::ProcessCpuSeconds(p));
    return s;
  };
  // What the figures count from: the end of the warm-up (its start without one).
  std::map<std::string, uint64_t> vm_before;
  std::vector<replay::DamonScheme> damon_before;
  double kswapd_before = 0, kdamond_before = 0, daemon_cpu_before = 0;
  rusage ru_before{};
  bool measuring = false;
  Clock::time_point measured_from;
  // kswapd gives a node up after 16 runs in a row that reclaim nothing, and
  // is then not woken again until some reclaim there succeeds. Sizing the
  // balloon can do that: node 0 then holds only locked memory and a ramfs
  // root, with nothing to reclaim or demote. A kernel arm with kswapd given up
  // never demotes: promotion finds node 0 at its watermarks, and new pages
  // fall back to node 1 before any allocation reclaims. (Two of three runs of
  // the tuned kernel on the llama workload, 2026-12-05, never demoted, kswapd
  // idle; whether it had given up was not recorded then.) So at the end of the
  // warm-up, in every arm, if node 0 is marked unreclaimable, the pool's
  // cgroup is asked to reclaim a little (its pages on node 0 are there by
  // then, and reclaim demotes them), which revives kswapd; before the
  // counters are read, so what that demotes is not counted as the arm's.
  bool unreclaimable_at_start = false, revived = false;
  std::string revive_error;
  auto revive_kswapd = [&] {
    unreclaimable_at_start = replay::NodeUserZones(fast_nodes.front()).unreclaimable;
    if (!unreclaimable_at_start || pool_cgroup.empty()) return;
    revive_error = replay::ReclaimFromCgroup(pool_cgroup, kReviveBytes);
    revived = !replay::NodeUserZones(fast_nodes.front()).unreclaimable;
    std::fprintf(stderr, "cxltier-replay: kswapd had given node %d up; reclaimed %s from %s: %s\n",
                 fast_nodes.front(), FormatBytes(kReviveBytes).c_str(), pool_cgroup.c_str(),
                 revived ? "revived" : ("still given up " + revive_error).c_str());
  };
  auto begin_measuring = [&] {
    revive_kswapd();
    measuring = true;
    measured_from = Clock::now();
    vm_before = replay::ReadVmstat();
    damon_before = replay::ReadDamonSchemes();
    kswapd_before = cpu_of(kswapd);
    kdamond_before = cpu_of(kdamond);
    daemon_cpu_before = daemon_pid ? replay::ProcessCpuSeconds(daemon_pid) : 0;
    getrusage(RUSAGE_SELF, &ru_before);
    if (client) daemon_before = daemon_status();
  };

  struct Live {
    uint32_t block = 0, slot = 0;
  };
  std::vector<Live> live(trace.keys.size());
  std::vector<bool> is_live(trace.keys.size(), false);
  // Each group's keys, for hints (a hint names the group's live keys).
  std::unordered_map<uint32_t, std::vector<uint32_t>> group_keys;
  if (send_hints) {
    for (uint32_t k = 0; k < trace.groups.size(); ++k) {
      if (trace.groups[k] != 0) group_keys[trace.groups[k]].push_back(k);
    }
  }
  uint64_t hints_sent = 0, hint_failures = 0;
  // Admitted and not yet touched: the touch that comes with an admission
  // (the block was just written, so it is wherever the allocator put it).
  // cxltier-sim counts that touch in no tier, so the share it compares with
  // leaves it out.
  std::vector<bool> fresh(trace.keys.size(), false);
  std::vector<uint32_t> free_blocks;
  for (uint32_t b = pool_blocks; b-- > 0;) free_blocks.push_back(b);
  const uint32_t last_step = trace.events.back().step;
  const uint32_t first_step = trace.events.front().step;
  const uint32_t per_point =
      std::max<uint32_t>(1, (last_step - first_step + intervals) / intervals);
  uint64_t touches = 0, touched_pages = 0, fast_pages = 0, unknown_pages = 0, pagemap_pages = 0;
  uint64_t admissions = 0, releases = 0, restored = 0, corrupt = 0, io_errors = 0, dev_next = 0;
  uint64_t observe_failures = 0;
  uint64_t all_touches = 0;  // warm-up included (which touches check their bytes)
  // Where admissions were written (the pages of each admitted block, asked
  // of the kernel right after the write): on the fast nodes or not.
  uint64_t admitted_pages = 0, admitted_fast = 0;
  uint64_t point_pages = 0, point_fast = 0, retouch_pages = 0, retouch_fast = 0;
  double client_seconds = 0;
  double read_seconds = 0;  // reading touched blocks (CPU loads or device writes)
  uint64_t steps = 0;
  volatile uint64_t sink = 0;
  nlohmann::json series = nlohmann::json::array();
  const uint64_t words = *block / 8;
  const auto start = Clock::now();
  uint32_t next_point = first_step + per_point;
  auto point = [&](uint32_t step) {
    const replay::Residency::Count pool_now = where.Query(pool, length, fast_nodes);
    const replay::ZoneMemory fast_now = replay::NodeUserZones(fast_nodes.front());
    series.push_back({{"t", Seconds(start)},
                      {"step", step},
                      {"share", point_pages ? double(point_fast) / point_pages : 0.0},
                      {"pool_fast_bytes", pool_now.fast * page},
                      {"pool_other_bytes", pool_now.other * page},
                      {"fast_free_bytes", fast_now.free},
                      {"kswapd_gave_up", fast_now.unreclaimable}});
    point_pages = point_fast = 0;
  };
  size_t i = 0;
  bool stopped_early = false;
  if (warmup_seconds <= 0) begin_measuring();
  while (i < trace.events.size()) {
    if (max_seconds > 0 && Seconds(start) >= max_seconds) {
      stopped_early = true;
      break;
    }
    const auto step_start = Clock::now();
    if (!measuring && Seconds(start) >= warmup_seconds) begin_measuring();
    steps += measuring;
    const uint32_t step = trace.events[i].step;
    size_t end = i;
    while (end < trace.events.size() && trace.events[end].step == step) ++end;
    // The step's events in order, with the daemon's calls batched as an engine
    // batches them: releases, then admissions, then the touches; a release
    // after an admission or touch of the same step sends those first.
    std::vector<BlockKey> release;
    std::vector<wire::AdmitEntry> admit;
    std::vector<uint32_t> admit_keys;
    std::vector<size_t> touch_events;
    std::vector<uint32_t> freed;  // blocks released, their memory freed after the Release
    auto flush_releases = [&]() -> Status {
      Status r = Status::Ok();
      if (client && !release.empty()) {
        const auto t0 = Clock::now();
        r = client->Release(release);
        if (measuring) client_seconds += Seconds(t0);
      }
      release.clear();
      // The engine frees the blocks' memory (the kernel forgets their pages),
      // once the daemon no longer moves them.
      for (uint32_t b : freed) {
        madvise(pool + uint64_t{b} * stride, stride, MADV_DONTNEED);
        free_blocks.push_back(b);
      }
      freed.clear();
      return r;
    };
    auto flush = [&]() -> Status {
      if (Status r = flush_releases(); !r.ok()) return r;
      if (client && !admit.empty()) {
        const auto t0 = Clock::now();
        std::vector<wire::AdmitResult> results;
        if (Status a = client->Admit(pool_id, admit, &results); !a.ok()) return a;
        if (measuring) client_seconds += Seconds(t0);
        if (results.size() != admit.size()) {
          return Status::Fail(wire::ErrorCode::kBadPayload,
                              "the daemon answered " + std::to_string(results.size()) +
                                  " admissions of " + std::to_string(admit.size()));
        }
        for (size_t k = 0; k < admit.size(); ++k) {
          live[admit_keys[k]].slot = results[k].slot;
          restored += results[k].restored;
        }
      }
      // Prefill (or loading a block back): the engine writes every byte, as
      // an engine does once the block is allocated, so its pages land where
      // the daemon placed it (or, without one, where the kernel puts them).
      for (uint32_t key : admit_keys) {
        auto* w = reinterpret_cast<uint64_t*>(pool + uint64_t{live[key].block} * stride);
        for (uint64_t x = 0; x < words; ++x) w[x] = Word(trace.keys[key], x);
        if (measuring) {
          const replay::Residency::Count c = where.Query(w, stride, fast_nodes);
          admitted_pages += c.fast + c.other + c.unknown;
          admitted_fast += c.fast;
        }
      }
      admit.clear();
      admit_keys.clear();
      // Where the step's touched blocks are, asked of the kernel in one call
      // just before they are read.
      std::vector<const void*> bases;
      for (size_t k : touch_events) {
        bases.push_back(pool + uint64_t{live[trace.events[k].key].block} * stride);
      }
      const std::vector<replay::Residency::Count> counts =
          where.QueryMany(bases, *block, fast_nodes);
      for (size_t t = 0; t < touch_events.size(); ++t) {
        const sim::TraceEvent& e = trace.events[touch_events[t]];
        uint8_t* at = pool + uint64_t{live[e.key].block} * stride;
        const replay::Residency::Count& c = counts[t];
        const uint64_t pages = c.fast + c.other + c.unknown;
        if (measuring) {
          ++touches;
          touched_pages += pages;
          fast_pages += c.fast;
          unknown_pages += c.unknown;
          pagemap_pages += c.via_pagemap;
        }
        if (!fresh[e.key]) {
          if (measuring) {
            retouch_pages += pages;
            retouch_fast += c.fast;
          }
          point_pages += pages;
          point_fast += c.fast;
        }
        fresh[e.key] = false;
        const auto read_start = Clock::now();
        if (dev >= 0) {
          const off_t off = static_cast<off_t>((dev_next++ % dev_slots) * *block);
          for (uint64_t o = 0; o < *block; o += device_io) {
            io_errors += pwrite(dev, at + o, device_io, off + static_cast<off_t>(o)) !=
                         static_cast<ssize_t>(device_io);
          }
        } else {
          const auto* w = reinterpret_cast<const uint64_t*>(at);
          uint64_t sum = 0;
          for (uint64_t x = 0; x < words; ++x) sum += w[x];
          sink = sink + sum;
          // Every 64th touch checks the bytes too (a move must never change them).
          if (++all_touches % 64 == 0) {
            for (uint64_t x = 0; x < words; x += 509) corrupt += w[x] != Word(trace.keys[e.key], x);
          }
        }
        if (measuring) read_seconds += Seconds(read_start);
        if (client) {
          const auto t0 = Clock::now();
          observe_failures += !client->Observe(live[e.key].slot, flat_scores ? 1.0f : e.obs);
          if (measuring) client_seconds += Seconds(t0);
        }
      }
      touch_events.clear();
      return Status::Ok();
    };
    for (size_t k = i; k < end; ++k) {
      const sim::TraceEvent& e = trace.events[k];
      // A hint goes to the daemon after the events before it (--hints), with
      // the group's live keys; its kind (1 to 3) was checked with the trace.
      if (e.kind == sim::EventKind::kHint) {
        if (!send_hints || !client) continue;
        if (Status r = flush(); !r.ok()) return Fail("daemon: " + r.message);
        std::vector<BlockKey> keys;
        if (auto g = group_keys.find(e.key); g != group_keys.end()) {
          for (uint32_t member : g->second) {
            if (is_live[member]) keys.push_back(trace.keys[member]);
          }
        }
        const auto t0 = Clock::now();
        const Status h =
            client->Hint(e.key, static_cast<HintKind>(static_cast<uint8_t>(e.obs)), keys);
        if (measuring) client_seconds += Seconds(t0);
        ++hints_sent;
        hint_failures += !h.ok();
        continue;
      }
      // Admitted at its first touch; the daemon's recorded moves are the daemon's.
      if (e.kind != sim::EventKind::kTouch && e.kind != sim::EventKind::kRelease) continue;
      if (e.kind == sim::EventKind::kRelease) {
        if (!is_live[e.key]) continue;
        if (!admit.empty() || !touch_events.empty()) {
          if (Status r = flush(); !r.ok()) return Fail("daemon: " + r.message);
        }
        is_live[e.key] = false;
        freed.push_back(live[e.key].block);
        release.push_back(trace.keys[e.key]);
        ++releases;
        continue;
      }
      if (!is_live[e.key]) {
        // An admission: the key's release (if this step had one) goes first.
        if (Status r = flush_releases(); !r.ok()) return Fail("release: " + r.message);
        if (free_blocks.empty()) return Fail("the pool is full (the fitted trace prevents that)");
        const uint32_t b = free_blocks.back();
        free_blocks.pop_back();
        live[e.key].block = b;
        is_live[e.key] = true;
        fresh[e.key] = true;
        admit.push_back({trace.keys[e.key], b});
        admit_keys.push_back(e.key);
        ++admissions;
      }
      touch_events.push_back(k);
    }
    if (Status r = flush(); !r.ok()) return Fail("daemon: " + r.message);
    i = end;
    if (step >= next_point || i == trace.events.size()) {
      point(step);
      next_point = step + per_point;
    }
    if (step_ms) {
      // A step lasts at least step_ms, and so does each step the trace
      // leaves empty before its next event (a recording's idle ticks).
      const uint64_t span = i < trace.events.size() ? trace.events[i].step - step : 1;
      std::this_thread::sleep_until(step_start + std::chrono::milliseconds(step_ms * span));
    }
  }
  if (!measuring) {
    return Fail("the run ended (" + std::to_string(Seconds(start)) +
                " s) before its --warmup did: nothing was measured");
  }
  const auto end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  rusage ru_after{};
  getrusage(RUSAGE_SELF, &ru_after);
  const double kswapd_after = cpu_of(kswapd), kdamond_after = cpu_of(kdamond);
  const double daemon_cpu_after = daemon_pid ? replay::ProcessCpuSeconds(daemon_pid) : 0;
  const std::map<std::string, uint64_t> vm_after = replay::ReadVmstat();
  auto vm = [&](const char* name) -> uint64_t {
    auto a = vm_after.find(name);
    auto b = vm_before.find(name);
    if (a == vm_after.end()) return 0;
    return a->second - std::min(a->second, b == vm_before.end() ? 0 : b->second);
  };
  nlohmann::json kernel = nlohmann::json::object();
  for (const char* name :
       {"numa_pte_updates", "numa_hint_faults", "numa_hint_faults_local", "numa_pages_migrated",
        "pgpromote_success", "pgpromote_candidate", "pgdemote_kswapd", "pgdemote_direct",
        "pgmigrate_success", "pgmigrate_fail"}) {
    kernel[name] = vm(name);
  }
  kernel["promoted_bytes"] = vm("pgpromote_success") * page;
  kernel["demoted_bytes"] = (vm("pgdemote_kswapd") + vm("pgdemote_direct")) * page;
  // DAMON's schemes over the same window (the kdamonds running now, in the
  // order they were at its start).
  const std::vector<replay::DamonScheme> damon_after = replay::ReadDamonSchemes();
  nlohmann::json damon = nlohmann::json::array();
  for (size_t s = 0; s < damon_after.size(); ++s) {
    const replay::DamonScheme& a = damon_after[s];
    const replay::DamonScheme* b =
        s < damon_before.size() && damon_before[s].action == a.action ? &damon_before[s] : nullptr;
    damon.push_back({{"action", a.action},
                     {"applied_bytes", a.applied_bytes - (b ? b->applied_bytes : 0)},
                     {"tried_bytes", a.tried_bytes - (b ? b->tried_bytes : 0)}});
  }
  kernel["damon_schemes"] = damon;

  // The steady state: the pool's bytes on the fast nodes over the second half
  // of the points after the warm-up.
  uint64_t steady_sum = 0, steady_n = 0;
  size_t measured_points = 0;
  while (measured_points < series.size() &&
         series[series.size() - 1 - measured_points]["t"].get<double>() >= warmup_seconds) {
    ++measured_points;
  }
  for (size_t p = series.size() - (measured_points + 1) / 2; p < series.size(); ++p) {
    steady_sum += series[p]["pool_fast_bytes"].get<uint64_t>();
    ++steady_n;
  }
  nlohmann::json out = {
      {"arm", arm},
      {"access", access},
      {"trace",
       {{"name", trace.name}, {"events", trace.events.size()}, {"keys", trace.keys.size()}}},
      {"block_bytes", *block},
      {"pool_blocks", pool_blocks},
      {"pool_bytes", length},
      {"fast_nodes", fast_nodes},
      {"balloon_bytes", balloon.bytes()},
      {"balloon_off_node_bytes", balloon.OffNodeBytes(fast_nodes.front())},
      {"fast_free_at_start", fast_at_start.free},
      {"fast_high_watermark", fast_at_start.high},
      {"fast_above_high_at_start", fast_at_start.above_high},
      {"fast_free_target", *fast_free},
      {"locked", locked},
      {"kswapd",
       {{"gave_up_at_start", unreclaimable_at_start},
        {"revived", revived},
        {"revive_error", revive_error},
        {"gave_up_at_end", replay::NodeUserZones(fast_nodes.front()).unreclaimable}}},
      {"seconds", seconds},
      {"measured_s", std::chrono::duration<double>(end - measured_from).count()},
      {"stopped_early", stopped_early},
      {"touches", touches},
      {"touched_bytes", touched_pages * page},
      {"fast_bytes", fast_pages * page},
      {"fast_share", touched_pages ? double(fast_pages) / touched_pages : 0.0},
      {"fast_share_retouch", retouch_pages ? double(retouch_fast) / retouch_pages : 0.0},
      {"retouched_bytes", retouch_pages * page},
      {"retouched_fast_bytes", retouch_fast * page},
      {"unknown_pages", unknown_pages},
      {"pages_placed_by_pagemap", pagemap_pages},
      {"admissions", admissions},
      {"admitted_bytes", admitted_pages * page},
      {"admitted_fast_share", admitted_pages ? double(admitted_fast) / admitted_pages : 0.0},
      {"warmup_s", warmup_seconds},
      {"releases", releases},
      {"corrupt_words", corrupt},
      {"observe_failures", observe_failures},
      {"scores", scores},
      {"hints_sent", hints_sent},
      {"hint_failures", hint_failures},
      {"io_errors", io_errors},
      {"pool_fast_bytes_steady", steady_n ? steady_sum / steady_n : 0},
      // Time reading touched blocks, in all and per step (in a guest under
      // TCG: emulated time, comparable between arms only).
      {"steps", steps},
      {"read_s", read_seconds},
      {"read_us_per_step", steps ? 1e6 * read_seconds / static_cast<double>(steps) : 0.0},
      {"kernel", kernel},
      {"cpu",
       {{"replay_user_s", RusageSeconds(ru_after.ru_utime) - RusageSeconds(ru_before.ru_utime)},
        {"replay_system_s", RusageSeconds(ru_after.ru_stime) - RusageSeconds(ru_before.ru_stime)},
        {"kswapd_s", kswapd_after - kswapd_before},
        {"kdamond_s", kdamond_after - kdamond_before},
        {"daemon_s", daemon_pid ? daemon_cpu_after - daemon_cpu_before : 0.0},
        {"client_calls_s", client_seconds}}},
      {"series", series}};
  if (client) {
    // Let the daemon fold the last observations and finish its moves, then
    // take its counters.
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * client->tick_ms()));
    const nlohmann::json after = daemon_status();
    const nlohmann::json& mb = daemon_before.value("migrations", nlohmann::json::object());
    const nlohmann::json& ma = after.value("migrations", nlohmann::json::object());
    auto delta = [&](const char* k) {
      const uint64_t a = ma.value(k, uint64_t{0}), b = mb.value(k, uint64_t{0});
      return a - std::min(a, b);
    };
    out["daemon"] = {{"policy", after.value("policy", std::string())},
                     {"promotions", delta("promotions")},
                     {"demotions", delta("demotions")},
                     {"promoted_bytes", delta("promoted_bytes")},
                     {"demoted_bytes", delta("demoted_bytes")},
                     {"failed", delta("failed")},
                     {"restored", restored}};
  }
  const std::string text = out.dump() + "\n";
  if (json_path.empty()) {
    std::cout << text;
  } else {
    std::ofstream f(json_path);
    f << text;
    if (!f) return Fail("cannot write " + json_path);
  }
  if (corrupt || io_errors || observe_failures || hint_failures) {
    return Fail(std::to_string(corrupt) + " corrupt words, " + std::to_string(io_errors) +
                " failed device writes, " + std::to_string(observe_failures) +
                " observations refused, " + std::to_string(hint_failures) + " hints refused");
  }
  return 0;
}
