// The JSON views of `Stats` and the systemd STATUS line, rendered from the
// plain structs of status.h; the tick-time recorder; the daemon's memory.
#include "service/status.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "fmt/format.h"

namespace cxltier::service {

const char* TierName(Tier t) {
  static constexpr const char* kNames[kMaxTiers] = {"fast",  "slow",  "tier2", "tier3",
                                                    "tier4", "tier5", "tier6", "tier7"};
  static_assert(kMaxTiers == 8, "one name per tier");
  return TierIndex(t) < kMaxTiers ? kNames[TierIndex(t)] : "none";
}

void TickTimes::Add(double seconds, double interval_s) {
  ++count;
  sum += seconds;
  overruns += seconds > interval_s;
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  ++buckets[b];
  recent[next++ % recent.size()] = seconds;
}

double TickTimes::Quantile(double q) const {
  const size_t n = std::min<uint64_t>(count, recent.size());
  if (n == 0) return 0;
  std::vector<double> v(recent.begin(), recent.begin() + static_cast<std::ptrdiff_t>(n));
  const size_t k = std::min(n - 1, static_cast<size_t>(q * static_cast<double>(n)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

TickSummary TickTimes::Summary() const {
  TickSummary s;
  s.count = count;
  s.sum = sum;
  s.overruns = overruns;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    cumulative += buckets[i];
    s.cumulative[i] = cumulative;
  }
  s.p50 = Quantile(0.50);
  s.p99 = Quantile(0.99);
  s.max_recent = Quantile(1.0);
  return s;
}

MemoryStatus ReadProcessMemory() {
  std::ifstream in("/proc/self/status");
  std::string line;
  MemoryStatus m;
  while (std::getline(in, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kib) == 1) m.rss_bytes = kib * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %llu kB", &kib) == 1) m.peak_rss_bytes = kib * 1024;
    if (std::sscanf(line.c_str(), "RssAnon: %llu kB", &kib) == 1) m.anon_bytes = kib * 1024;
    if (std::sscanf(line.c_str(), "RssShmem: %llu kB", &kib) == 1) m.shared_bytes = kib * 1024;
  }
  return m;
}

namespace {

nlohmann::json TickJson(const TickSummary& t) {
  nlohmann::json b = nlohmann::json::array();
  for (size_t i = 0; i < t.cumulative.size(); ++i) {
    b.push_back({{"le", i < TickTimes::kBounds.size() ? nlohmann::json(TickTimes::kBounds[i])
                                                      : nlohmann::json("+Inf")},
                 {"count", t.cumulative[i]}});
  }
  return {{"count", t.count}, {"sum", t.sum}, {"overruns", t.overruns},
          {"p50", t.p50},     {"p99", t.p99}, {"max_recent", t.max_recent},
          {"buckets", b}};
}

nlohmann::json MigrationJson(const StatusSnapshot& s) {
  const MigrationStatus& m = s.migrations;
  nlohmann::json errors = nlohmann::json::object();
  for (auto [e, n] : m.moves.errors) errors[std::strerror(e)] = n;
  return {{"enabled", m.enabled},
          {"promotions", m.promotions},
          {"demotions", m.demotions},
          {"promoted_bytes", m.promoted_bytes},
          {"demoted_bytes", m.demoted_bytes},
          {"failed", m.moves.failed},
          {"pending", m.pending},
          {"budget_bytes_per_tick", m.budget_bytes_per_tick},
          {"max_budget_bytes_per_tick", m.max_budget_bytes_per_tick},
          {"pages_verified", m.moves.pages_verified},
          {"pages_absent", m.moves.pages_absent},
          {"pages_busy", m.moves.pages_busy},
          {"pages_elsewhere", m.moves.pages_elsewhere},
          {"errors", errors},
          {"pools_pinned", m.moves.pools_pinned},
          {"moves_refused_pinned", m.moves.moves_refused_pinned},
          {"stale_moves", m.moves.stale_moves},
          {"stale_scans", m.moves.stale_scans},
          {"plans_paced", m.moves.plans_paced},
          {"released_pages",
           {{"held_blocks", m.moves.released_held},
            {"moved", m.moves.released_moved},
            {"failed", m.moves.released_failed},
            {"reused", m.moves.released_reused}}},
          {"copy",
           {{"copies", m.moves.copies},
            {"copied_bytes", m.moves.copied_bytes},
            {"dropped_written", m.moves.copies_written},
            {"dropped_mismatch", m.moves.copies_mismatch},
            {"no_room", m.moves.copies_no_room},
            {"places_freed", m.moves.places_freed},
            {"places_draining", m.places_draining},
            {"oldest_lease_wait_s", s.oldest_lease_wait_s()},
            {"lease_timeouts", m.moves.lease_timeouts},
            {"write_lease_timeouts", m.moves.write_lease_timeouts}}}};
}

}  // namespace

nlohmann::json TiersToJson(const std::vector<TierStatus>& tiers) {
  nlohmann::json out = nlohmann::json::array();
  for (const TierStatus& t : tiers) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const NodeStatus& n : t.nodes) {
      nlohmann::json x = {{"node", n.node}};
      if (n.known) {
        x["memory_bytes"] = n.memory_bytes;
        x["cpus"] = n.cpus;
        if (n.read_latency_ns) x["read_latency_ns"] = *n.read_latency_ns;
        if (n.read_bandwidth_mib_s) x["read_bandwidth_mib_s"] = *n.read_bandwidth_mib_s;
        if (n.kernel_memory_tier) x["kernel_memory_tier"] = *n.kernel_memory_tier;
      }
      nodes.push_back(x);
    }
    out.push_back({{"tier", t.tier},
                   {"nodes", nodes},
                   {"blocks", t.blocks},
                   {"used_bytes", t.used_bytes},
                   {"budget_bytes", t.budget_bytes}});
  }
  return out;
}

void QuotaStatus::KeepOnly(uid_t uid) {
  std::erase_if(users, [uid](const AccountStatus& a) { return a.uid != uid; });
  std::erase_if(clients, [uid](const AccountStatus& a) { return a.uid != uid; });
  // The host-wide count says how much other users lost: the peer's own only.
  quota_evictions = 0;
  for (const AccountStatus& a : users) quota_evictions += a.quota_evictions;
}

nlohmann::json QuotasToJson(const QuotaStatus& q, uint64_t block_bytes) {
  auto account = [block_bytes](const AccountStatus& a, bool user) {
    nlohmann::json tiers = nlohmann::json::array();
    for (size_t k = 0; k < a.tier_blocks.size(); ++k) {
      nlohmann::json t = {
          {"tier", k}, {"blocks", a.tier_blocks[k]}, {"bytes", a.tier_blocks[k] * block_bytes}};
      if (k < a.cap_blocks.size() && a.cap_blocks[k] != AccountStatus::kNoCapBlocks) {
        t["cap_blocks"] = a.cap_blocks[k];
        t["cap_bytes"] = a.cap_blocks[k] * block_bytes;
      }
      tiers.push_back(t);
    }
    nlohmann::json j = {{"uid", a.uid},
                        {"quota", a.has_quota},
                        {"tiers", tiers},
                        {"in_set", a.in_set},
                        {"quota_evictions", a.quota_evictions},
                        {"held_blocks", a.held_blocks}};
    if (user) {
      j["guarantee_blocks"] = a.guarantee_blocks;
      j["guarantee_bytes"] = a.guarantee_blocks * block_bytes;
    } else {
      j["id"] = a.client_id;
      j["name"] = a.client_name;
    }
    return j;
  };
  nlohmann::json users = nlohmann::json::array(), clients = nlohmann::json::array();
  for (const AccountStatus& a : q.users) users.push_back(account(a, true));
  for (const AccountStatus& a : q.clients) clients.push_back(account(a, false));
  return {{"quota_evictions", q.quota_evictions}, {"users", users}, {"clients", clients}};
}

nlohmann::json StatusToJson(const StatusSnapshot& s) {
  const server::ServerCounters& sc = s.server;
  const MemoryStatus& m = s.memory;
  nlohmann::json shards = nullptr;
  if (s.shards) {
    shards = {{"leader", s.shards->leader},
              {"switches", s.shards->switches},
              {"rate", s.shards->rate},
              {"sampled_touches", s.shards->sampled_touches},
              {"sampled_keys", s.shards->sampled_keys}};
  }
  return {
      {"clients", s.clients},
      {"connections", s.connections},
      {"leaving_clients", s.leaving},
      {"blocks", s.blocks},
      {"ghosts", s.ghosts},
      {"ghosts_loaded_at_start", s.ghosts_loaded_at_start},
      {"ghost_restores", s.ghost_restores},
      {"policy", s.policy},
      {"shards", shards},
      {"persist", s.persist},
      {"block_bytes", s.block_bytes},
      {"ticks", s.ticks},
      {"warnings", {{"logged", s.warnings_logged}, {"suppressed", s.warnings_suppressed}}},
      {"server",
       {{"closed_stalled_replies", sc.stalled_closed},
        {"closed_frame_timeouts", sc.frame_timeouts},
        {"closed_idle", sc.idle_closed},
        {"accept_backoffs", sc.accept_backoffs},
        {"fds_dropped", sc.fds_dropped},
        {"handler_exceptions", sc.handler_exceptions}}},
      {"tick_ms", s.tick_ms},
      {"lease_timeout_s", s.lease_timeout_s},
      {"tick_seconds", TickJson(s.tick_seconds)},
      {"memory",
       {{"rss_bytes", m.rss_bytes},
        {"peak_rss_bytes", m.peak_rss_bytes},
        {"anon_bytes", m.anon_bytes},
        {"shared_bytes", m.shared_bytes}}},
      {"metrics_endpoint", s.metrics_endpoint},
      {"touches", s.touches},
      {"hits", s.hits},
      {"hit_rate", s.hit_rate()},
      {"tiers", TiersToJson(s.tiers)},
      {"migrations", MigrationJson(s)},
      {"hints",
       {{"requests", s.hints.requests},
        {"unknown_keys", s.hints.unknown_keys},
        {"applied", s.hints.applied},
        {"prefetched", s.hints.prefetched},
        {"displaced", s.hints.displaced},
        {"prefetch_hits", s.hints.prefetch_hits},
        {"units", s.hints.units},
        {"throttled", s.hints.throttled},
        {"work", s.hints.work},
        {"deferred", s.hints.deferred},
        {"max_units", s.hints.max_units},
        {"slice_units", s.hints.slice_units},
        {"budget_units", s.hints.budget_units},
        {"budget_units_per_second", s.hints.budget_units_per_second}}},
      {"quotas", QuotasToJson(s.quotas, s.block_bytes)},
  };
}

nlohmann::json ClientsToJson(const std::vector<ClientStatus>& clients) {
  nlohmann::json out = nlohmann::json::array();
  for (const ClientStatus& c : clients) {
    out.push_back({{"id", c.id},
                   {"name", c.name},
                   {"pid", c.pid},
                   {"uid", c.uid},
                   {"blocks", c.blocks},
                   {"slots", c.slots},
                   {"pools", c.pools},
                   {"observations", c.observations},
                   {"bad_observations", c.bad_observations}});
  }
  return out;
}

nlohmann::json BlocksToJson(const BlockRanking& ranking) {
  auto rows = [](const std::vector<BlockRanking::Row>& v) {
    nlohmann::json out = nlohmann::json::array();
    for (const BlockRanking::Row& r : v) {
      out.push_back({{"key", r.key},
                     {"client", r.client},
                     {"slot", r.slot},
                     {"score", r.score},
                     {"touches", r.touches},
                     {"tier", TierName(r.tier)}});
    }
    return out;
  };
  return {{"blocks", ranking.blocks},
          {"hottest", rows(ranking.hottest)},
          {"coldest", rows(ranking.coldest)}};
}

std::string SystemdStatusLine(const StatusSnapshot& s) {
  return fmt::format("{} clients, {} blocks, hit rate {:.1f}%, tier 0 {} blocks, {} moves failed",
                     s.clients, s.blocks, 100.0 * s.hit_rate(),
                     s.tiers.empty() ? 0 : s.tiers.front().blocks, s.migrations.moves.failed);
}

}  // namespace cxltier::service
