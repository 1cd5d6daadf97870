// What the daemon reports, as plain values: Snapshot() (snapshot.h) fills a
// StatusSnapshot once, and every view renders from it: the JSON of `Stats
// status` (cxltierctl, tests and scripts read its keys), the Prometheus text
// (metrics.cpp) and the one-line systemd STATUS. Renderers read only the
// snapshot, so the three cannot drift apart, and they can be tested without
// a daemon.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/block.h"
#include "server/server.h"

namespace cxltier::service {

struct TickSummary;

// Tick durations: a cumulative histogram (for metrics) and the most recent
// 4096 (for quantiles). Kept by the daemon; a snapshot holds its Summary().
struct TickTimes {
  static constexpr std::array<double, 11> kBounds = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3,  2.5e-3,
                                                     5e-3,  10e-3,  25e-3,  50e-3,  100e-3};
  std::array<uint64_t, kBounds.size() + 1> buckets{};  // the last is +Inf
  uint64_t count = 0;
  double sum = 0;
  uint64_t overruns = 0;  // ticks that took longer than their interval
  std::array<double, 4096> recent{};
  uint64_t next = 0;

  // One tick of `seconds`, run every `interval_s`: longer counts as an overrun
  // (the next tick starts late).
  void Add(double seconds, double interval_s);
  double Quantile(double q) const;  // over the recent ones
  TickSummary Summary() const;
};

struct TickSummary {
  uint64_t count = 0;
  double sum = 0;  // seconds
  uint64_t overruns = 0;
  // cumulative[i]: ticks of at most TickTimes::kBounds[i] seconds; the last, all of them.
  std::array<uint64_t, TickTimes::kBounds.size() + 1> cumulative{};
  double p50 = 0;  // quantiles over the recent ticks, in seconds
  double p99 = 0;
  double max_recent = 0;
};

// The daemon's resident memory, from /proc/self/status.
struct MemoryStatus {
  uint64_t rss_bytes = 0;
  uint64_t peak_rss_bytes = 0;
  uint64_t anon_bytes = 0;  // its own: heap, tables
  // Shared: the state segments and the clients' memfd pools it maps to move them.
  uint64_t shared_bytes = 0;
};
// Fields it cannot read stay 0.
MemoryStatus ReadProcessMemory();

struct NodeStatus {
  int node = 0;
  // In the topology: without it (a node named only in [tiers]) the figures
  // below are not known and not shown.
  bool known = false;
  uint64_t memory_bytes = 0;
  uint64_t cpus = 0;
  std::optional<uint64_t> read_latency_ns;       // HMAT
  std::optional<uint64_t> read_bandwidth_mib_s;  // HMAT
  std::optional<int> kernel_memory_tier;
};

struct TierStatus {
  int tier = 0;  // 0 fast (DRAM), then slower: 1 (CXL, remote), 2, ...
  std::vector<NodeStatus> nodes;
  uint64_t blocks = 0;
  uint64_t used_bytes = 0;
  uint64_t budget_bytes = 0;  // 0: no budget (the last tier, which holds the rest)
};

// What the mover's results came to, counted as they come back (MoveDispatch).
struct MoveStats {
  uint64_t in_flight = 0;       // handed to the mover, result not yet back
  uint64_t failed = 0;          // block moves not done (retried with backoff)
  uint64_t pages_verified = 0;  // on their target node after a move
  uint64_t pages_absent = 0;    // never faulted in
  uint64_t pages_busy = 0;      // EBUSY: pinned
  uint64_t pages_elsewhere = 0;
  std::map<int, uint64_t> errors;  // pages or calls that failed, by errno
  // Page mode: pools whose pages move_pages found all busy, and the moves of
  // their blocks not tried since.
  uint64_t pools_pinned = 0;
  uint64_t moves_refused_pinned = 0;
  // Page moves whose block was released (or taken by another key) before
  // they finished, and the scans of a client's slots that found the blocks'
  // holders: one per client and tick, however many came back stale.
  uint64_t stale_moves = 0;
  uint64_t stale_scans = 0;
  // Page mode: released blocks' pages held in tier 0 (ReleasedPages) now,
  // those moved down (the move done, or not: then counted failed too), and
  // those a new block was admitted on before they were moved.
  uint64_t released_held = 0;
  uint64_t released_moved = 0;
  uint64_t released_failed = 0;
  uint64_t released_reused = 0;
  // Ticks that made no plan because the mover had not finished the last one
  // (PlanPace: the plans' budget follows the mover).
  uint64_t plans_paced = 0;
  // Copy mode.
  uint64_t copies = 0;  // verified and published
  uint64_t copied_bytes = 0;
  uint64_t copies_written = 0;        // dropped: the client held or took the write lease
  uint64_t copies_mismatch = 0;       // dropped: the copy differed from the source
  uint64_t copies_no_room = 0;        // not tried: no free block in the target tier's pool
  uint64_t places_freed = 0;          // old places reused after their readers left
  uint64_t lease_timeouts = 0;        // places a read lease held past lease_timeout_s
  uint64_t write_lease_timeouts = 0;  // blocks a write lease kept from moving that long
};

struct MigrationStatus {
  bool enabled = false;
  uint64_t promotions = 0;
  uint64_t demotions = 0;
  uint64_t promoted_bytes = 0;
  uint64_t demoted_bytes = 0;
  uint64_t pending = 0;                    // queued or running in the mover
  uint64_t budget_bytes_per_tick = 0;      // the next plan's (PlanPace)
  uint64_t max_budget_bytes_per_tick = 0;  // its cap: PlanCapBytes
  MoveStats moves;
  uint64_t places_draining = 0;  // copy mode: old places waiting for readers
  // Copy mode: ticks the oldest of them has waited for its read lease to go
  // (places the mover still reads are not counted; 0: none waits).
  uint64_t oldest_drain_ticks = 0;
};

// Scheduler hints (docs/protocol.md, "Hints").
struct HintStatus {
  uint64_t requests = 0;       // Hint messages answered
  uint64_t unknown_keys = 0;   // keys they named that their client did not hold
  uint64_t applied = 0;        // hints the engine applied (their group had live blocks)
  uint64_t prefetched = 0;     // blocks soon hints put into tier 0's set ahead of use
  uint64_t displaced = 0;      // blocks of idle or done groups taken out of it first
  uint64_t prefetch_hits = 0;  // prefetched blocks touched next while in tier 0
  // What they cost (docs/protocol.md, "What a hint costs").
  uint64_t units = 0;         // cost units charged to their senders
  uint64_t throttled = 0;     // times a uid over its hint budget was made to wait
  uint64_t work = 0;          // units of the engine's group-wide work, at hints and ticks
  uint64_t deferred = 0;      // hints whose group-wide work went on at the ticks
  uint64_t max_units = 0;     // the most one hint cost beyond the keys it named
  uint64_t slice_units = 0;   // the engine's slice of group-wide work (0: none)
  uint64_t budget_units = 0;  // a uid's hint budget: units at once
  uint64_t budget_units_per_second = 0;  // and per second after that
};

// One account's share and quota (docs/operations.md, "Quotas"): a user (by
// uid: every block its clients hold) or a client with a quota.
struct AccountStatus {
  uint32_t uid = 0;                   // the user, or the client's user
  uint64_t client_id = 0;             // clients: its first connection (they share the account)
  std::string client_name;            // clients: the hello name of its connections
  std::vector<uint64_t> tier_blocks;  // its live blocks in each tier, tier 0 first
  // Its quota as enforced, in blocks (the configured bytes rounded down to
  // whole blocks): cap_blocks[k] for tier k (kNoCapBlocks: none).
  static constexpr uint64_t kNoCapBlocks = UINT64_MAX;
  std::vector<uint64_t> cap_blocks;
  uint64_t guarantee_blocks = 0;
  bool has_quota = false;
  // From the engine, once a quota was set: its blocks in the policy's tier-0
  // set, and those quotas took out of it.
  uint64_t in_set = 0;
  uint64_t quota_evictions = 0;
  // Tier-0 pages its released blocks left there, counted against its tier-0
  // cap until moved down or admitted on again.
  uint64_t held_blocks = 0;
};

struct QuotaStatus {
  uint64_t quota_evictions = 0;        // every account's (the engine's counter)
  std::vector<AccountStatus> users;    // every uid with a live block or a quota, by uid
  std::vector<AccountStatus> clients;  // client accounts with a quota and a connection, by id
  // Status for a peer that is neither root nor in the admin group: only its
  // own uid's users and clients rows are left (the others' usage stays private).
  void KeepOnly(uid_t uid);
};

// The default policy's choice (shards: docs/policies.md, "shards"): which
// candidate ranks the blocks now, and what its choice rests on.
struct ShardsStatus {
  std::string leader;  // the candidate's name, as in the policy's spec
  uint64_t switches = 0;
  double rate = 0;               // the share of keys sampled
  uint64_t sampled_touches = 0;  // since the policy was made
  uint64_t sampled_keys = 0;     // keys in the sample, live or released
};

struct StatusSnapshot {
  bool per_uid_metrics = false;  // [metrics] per_uid: the cxltier_user_* series
  uint64_t clients = 0;          // said hello and still connected
  uint64_t connections = 0;      // connected sessions, operator tools included
  uint64_t leaving = 0;          // clients gone whose slots are still being released
  uint64_t blocks = 0;           // admitted (a client that left counts until released)
  uint64_t observations = 0;
  uint64_t bad_observations = 0;
  uint64_t ghosts = 0;
  uint64_t ghosts_loaded_at_start = 0;
  uint64_t ghost_restores = 0;
  std::string policy;
  std::optional<ShardsStatus> shards;  // when the policy is shards
  bool persist = false;
  uint64_t block_bytes = 0;  // 0: no engine yet (no block size known)
  uint64_t ticks = 0;
  uint32_t tick_ms = 0;
  uint32_t lease_timeout_s = 0;
  uint64_t touches = 0;
  uint64_t hits = 0;
  uint64_t warnings_logged = 0;
  uint64_t warnings_suppressed = 0;
  server::ServerCounters server;
  TickSummary tick_seconds;
  MemoryStatus memory;
  std::string metrics_endpoint;   // "": no metrics server
  std::vector<TierStatus> tiers;  // by tier number
  MigrationStatus migrations;
  HintStatus hints;
  QuotaStatus quotas;

  // The oldest place's wait for its read lease, in seconds.
  double oldest_lease_wait_s() const {
    return static_cast<double>(migrations.oldest_drain_ticks) * tick_ms / 1000.0;
  }
  double hit_rate() const {
    return touches ? static_cast<double>(hits) / static_cast<double>(touches) : 0.0;
  }
};

// One row of `Stats clients`.
struct ClientStatus {
  uint64_t id = 0;
  std::string name;
  pid_t pid = 0;
  uid_t uid = 0;
  uint64_t blocks = 0;
  uint64_t slots = 0;
  uint64_t pools = 0;
  uint64_t observations = 0;
  uint64_t bad_observations = 0;
};

// `Stats blocks`: how many, and the hottest and coldest few by score.
struct BlockRanking {
  static constexpr size_t kShown = 20;
  struct Row {
    std::string key;
    uint64_t client = 0;
    uint32_t slot = 0;
    double score = 0;
    uint32_t touches = 0;
    Tier tier = Tier::kNone;
  };
  uint64_t blocks = 0;
  std::vector<Row> hottest;  // hottest first
  std::vector<Row> coldest;  // coldest first
};

nlohmann::json StatusToJson(const StatusSnapshot& s);
nlohmann::json TiersToJson(const std::vector<TierStatus>& tiers);
nlohmann::json ClientsToJson(const std::vector<ClientStatus>& clients);
nlohmann::json BlocksToJson(const BlockRanking& ranking);
// `Stats quotas` and status's "quotas": byte figures are blocks times `block_bytes`.
nlohmann::json QuotasToJson(const QuotaStatus& quotas, uint64_t block_bytes);
// The Prometheus text exposition, format 0.0.4 (metrics.cpp).
std::string MetricsExposition(const StatusSnapshot& s);
// The line `systemctl status` shows.
std::string SystemdStatusLine(const StatusSnapshot& s);
// "fast" (tier 0), "slow" (tier 1), "tier2" .. "tier7" on hosts with more
// tiers, or "none": as status and the logs name tiers.
const char* TierName(Tier t);

}  // namespace cxltier::service
