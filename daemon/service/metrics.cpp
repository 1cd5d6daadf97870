// The Prometheus exposition of a status snapshot (text format 0.0.4).
// Names and units follow the Prometheus conventions: base units (bytes,
// seconds), `_total` for counters, one HELP and TYPE line per family.
#include <cstring>
#include <string>

#include "fmt/format.h"
#include "service/status.h"

namespace cxltier::service {

namespace {

class Exposition {
 public:
  void Family(const char* name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void Sample(const std::string& name, double v, const std::string& labels = "") {
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += fmt::format(" {}\n", v);
  }
  void Metric(const char* name, const char* type, const char* help, double v) {
    Family(name, type, help);
    Sample(name, v);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string ErrnoName(int e) {
  const char* n = strerrorname_np(e);
  return n ? n : "E" + std::to_string(e);
}

}  // namespace

std::string MetricsExposition(const StatusSnapshot& s) {
  const MigrationStatus& m = s.migrations;
  Exposition x;
  x.Family("cxltier_tier_blocks", "gauge",
           "Blocks resident in each tier (0 DRAM, then each slower tier in order).");
  for (const TierStatus& t : s.tiers) {
    x.Sample("cxltier_tier_blocks", static_cast<double>(t.blocks),
             fmt::format("tier=\"{}\"", t.tier));
  }
  x.Family("cxltier_tier_bytes", "gauge", "Bytes of KV blocks resident in each tier.");
  for (const TierStatus& t : s.tiers) {
    x.Sample("cxltier_tier_bytes", static_cast<double>(t.used_bytes),
             fmt::format("tier=\"{}\"", t.tier));
  }
  // Each user's share (every uid with a live block or a quota) and quota,
  // only when [metrics] per_uid asks for them: the endpoint checks no reader.
  const QuotaStatus& q = s.quotas;
  if (s.per_uid_metrics) {
    x.Family("cxltier_user_tier_bytes", "gauge",
             "Bytes of a uid's KV blocks resident in each tier.");
    for (const AccountStatus& a : q.users) {
      for (size_t k = 0; k < a.tier_blocks.size(); ++k) {
        x.Sample("cxltier_user_tier_bytes", static_cast<double>(a.tier_blocks[k] * s.block_bytes),
                 fmt::format("uid=\"{}\",tier=\"{}\"", a.uid, k));
      }
    }
    x.Family("cxltier_user_tier_cap_bytes", "gauge",
             "A uid's quota: the most bytes of its blocks a tier may hold (capped tiers only).");
    for (const AccountStatus& a : q.users) {
      for (size_t k = 0; k < a.cap_blocks.size(); ++k) {
        if (a.cap_blocks[k] == AccountStatus::kNoCapBlocks) continue;
        x.Sample("cxltier_user_tier_cap_bytes",
                 static_cast<double>(a.cap_blocks[k] * s.block_bytes),
                 fmt::format("uid=\"{}\",tier=\"{}\"", a.uid, k));
      }
    }
    x.Family("cxltier_user_guarantee_bytes", "gauge",
             "A uid's guaranteed tier-0 bytes: other users' misses leave them alone.");
    for (const AccountStatus& a : q.users) {
      if (a.guarantee_blocks == 0) continue;
      x.Sample("cxltier_user_guarantee_bytes",
               static_cast<double>(a.guarantee_blocks * s.block_bytes),
               fmt::format("uid=\"{}\"", a.uid));
    }
    x.Family("cxltier_user_quota_evictions_total", "counter",
             "A uid's blocks taken out of tier 0's set by its cap or by a guarantee.");
    for (const AccountStatus& a : q.users) {
      x.Sample("cxltier_user_quota_evictions_total", static_cast<double>(a.quota_evictions),
               fmt::format("uid=\"{}\"", a.uid));
    }
  }
  x.Metric("cxltier_quota_evictions_total", "counter",
           "Blocks taken out of tier 0's set by a cap or a guarantee (every account).",
           static_cast<double>(q.quota_evictions));
  x.Metric("cxltier_tier0_budget_bytes", "gauge", "Bytes of tier 0 cxltier may fill.",
           static_cast<double>(s.tiers.empty() ? 0 : s.tiers.front().budget_bytes));
  // Every tier but the last, which holds the rest (no budget, no sample).
  x.Family("cxltier_tier_budget_bytes", "gauge",
           "Bytes of each tier cxltier may fill (every tier but the last).");
  for (size_t k = 0; k + 1 < s.tiers.size(); ++k) {
    x.Sample("cxltier_tier_budget_bytes", static_cast<double>(s.tiers[k].budget_bytes),
             fmt::format("tier=\"{}\"", s.tiers[k].tier));
  }
  x.Metric("cxltier_block_bytes", "gauge", "Bytes of one KV block.",
           static_cast<double>(s.block_bytes));
  if (s.shards) {
    // Which candidate of the default policy ranks the blocks (an info-style
    // series: 1 for the leader), and how often that changed.
    x.Family("cxltier_policy_leader_info", "gauge",
             "The shards policy's leading candidate, which ranks the blocks (value 1).");
    x.Sample("cxltier_policy_leader_info", 1, fmt::format("leader=\"{}\"", s.shards->leader));
    x.Metric("cxltier_policy_switches_total", "counter",
             "Times the shards policy changed its leading candidate.",
             static_cast<double>(s.shards->switches));
  }
  x.Metric("cxltier_touches_total", "counter", "Block touches folded (one per block per tick).",
           static_cast<double>(s.touches));
  x.Metric("cxltier_hits_total", "counter", "Touches of blocks that were in tier 0.",
           static_cast<double>(s.hits));
  x.Metric("cxltier_hit_ratio", "gauge", "hits_total / touches_total since start.", s.hit_rate());
  x.Metric("cxltier_promotions_total", "counter",
           "Verified moves to a faster tier (tier 1 to 0 with two).",
           static_cast<double>(m.promotions));
  x.Metric("cxltier_demotions_total", "counter",
           "Verified moves to a slower tier (tier 0 to 1 with two).",
           static_cast<double>(m.demotions));
  x.Metric("cxltier_promoted_bytes_total", "counter", "Bytes moved to a faster tier.",
           static_cast<double>(m.promoted_bytes));
  x.Metric("cxltier_demoted_bytes_total", "counter", "Bytes moved to a slower tier.",
           static_cast<double>(m.demoted_bytes));
  x.Metric("cxltier_migration_enabled", "gauge",
           "1: page moves are on (migration.enabled, a slow tier, CAP_SYS_NICE); 0: they are "
           "off and only copy-mode clients' blocks move.",
           m.enabled ? 1 : 0);
  x.Metric("cxltier_migration_failed_moves_total", "counter",
           "Block moves that did not complete (retried with backoff).",
           static_cast<double>(m.moves.failed));
  x.Family("cxltier_migration_failures_total", "counter",
           "Pages or calls that failed to move, by errno.");
  for (auto [e, n] : m.moves.errors) {
    x.Sample("cxltier_migration_failures_total", static_cast<double>(n),
             fmt::format("errno=\"{}\"", ErrnoName(e)));
  }
  x.Metric("cxltier_pages_wrong_node_total", "counter",
           "Pages verification found on another node than the move's target.",
           static_cast<double>(m.moves.pages_elsewhere));
  x.Metric("cxltier_pages_busy_total", "counter", "Pages that could not move (EBUSY: pinned).",
           static_cast<double>(m.moves.pages_busy));
  x.Metric("cxltier_pages_verified_total", "counter", "Pages verified on their target node.",
           static_cast<double>(m.moves.pages_verified));
  x.Metric("cxltier_pending_moves", "gauge", "Moves queued or running in the mover.",
           static_cast<double>(m.pending));
  x.Metric("cxltier_pools_pinned", "gauge",
           "Page-mode pools whose pages move_pages found all busy (pinned): use copy mode.",
           static_cast<double>(m.moves.pools_pinned));
  x.Metric("cxltier_released_held_blocks", "gauge",
           "Page mode: blocks' worth of released blocks' pages counted in tier 0 until moved "
           "down or reused.",
           static_cast<double>(m.moves.released_held));
  x.Metric("cxltier_released_moved_total", "counter",
           "Page mode: released blocks' pages moved down out of tier 0 (done or not).",
           static_cast<double>(m.moves.released_moved));
  x.Metric("cxltier_copies_total", "counter", "Copy mode: blocks copied, verified and published.",
           static_cast<double>(m.moves.copies));
  x.Metric("cxltier_copied_bytes_total", "counter", "Copy mode: bytes of the copies published.",
           static_cast<double>(m.moves.copied_bytes));
  x.Family("cxltier_copies_dropped_total", "counter",
           "Copy mode: copies not published, by reason.");
  x.Sample("cxltier_copies_dropped_total", static_cast<double>(m.moves.copies_written),
           "reason=\"write_lease\"");
  x.Sample("cxltier_copies_dropped_total", static_cast<double>(m.moves.copies_mismatch),
           "reason=\"mismatch\"");
  x.Sample("cxltier_copies_dropped_total", static_cast<double>(m.moves.copies_no_room),
           "reason=\"no_room\"");
  x.Metric("cxltier_places_draining", "gauge",
           "Copy mode: old places of moved or released blocks waiting for their readers.",
           static_cast<double>(m.places_draining));
  x.Metric("cxltier_lease_oldest_wait_seconds", "gauge",
           "Copy mode: how long the oldest old place still named by a read lease has waited "
           "for reuse (0: none waits).",
           s.oldest_lease_wait_s());
  x.Metric("cxltier_lease_timeout_seconds", "gauge",
           "limits.lease_timeout_s: a lease held this long is counted and warned about.",
           static_cast<double>(s.lease_timeout_s));
  x.Family("cxltier_lease_timeouts_total", "counter",
           "Copy mode: leases held past limits.lease_timeout_s, by kind.");
  x.Sample("cxltier_lease_timeouts_total", static_cast<double>(m.moves.lease_timeouts),
           "kind=\"read\"");
  x.Sample("cxltier_lease_timeouts_total", static_cast<double>(m.moves.write_lease_timeouts),
           "kind=\"write\"");
  x.Metric("cxltier_hint_requests_total", "counter",
           "Scheduler hint messages answered (applied or not).",
           static_cast<double>(s.hints.requests));
  x.Metric("cxltier_hints_total", "counter",
           "Scheduler hints the engine applied (their group had live blocks).",
           static_cast<double>(s.hints.applied));
  x.Metric("cxltier_hint_prefetched_blocks_total", "counter",
           "Blocks soon hints put into tier 0's set ahead of their touch.",
           static_cast<double>(s.hints.prefetched));
  x.Metric("cxltier_hint_displaced_blocks_total", "counter",
           "Blocks of idle or done groups taken out of tier 0's set before any other.",
           static_cast<double>(s.hints.displaced));
  x.Metric("cxltier_hint_prefetch_hits_total", "counter",
           "Blocks soon hints prefetched that were touched next while in tier 0.",
           static_cast<double>(s.hints.prefetch_hits));
  x.Family("cxltier_tick_duration_seconds", "histogram", "Duration of one fold + plan tick.");
  for (size_t i = 0; i < s.tick_seconds.cumulative.size(); ++i) {
    const std::string le = i < TickTimes::kBounds.size() ? fmt::format("{}", TickTimes::kBounds[i])
                                                         : std::string("+Inf");
    x.Sample("cxltier_tick_duration_seconds_bucket",
             static_cast<double>(s.tick_seconds.cumulative[i]), "le=\"" + le + "\"");
  }
  x.Sample("cxltier_tick_duration_seconds_sum", s.tick_seconds.sum);
  x.Sample("cxltier_tick_duration_seconds_count", static_cast<double>(s.tick_seconds.count));
  x.Metric("cxltier_tick_interval_seconds", "gauge", "daemon.tick_ms: one tick is due this often.",
           s.tick_ms / 1000.0);
  x.Metric("cxltier_tick_overruns_total", "counter",
           "Ticks that took longer than their interval (the next one started late).",
           static_cast<double>(s.tick_seconds.overruns));
  x.Metric("cxltier_clients", "gauge", "Clients that said hello.", static_cast<double>(s.clients));
  x.Metric("cxltier_blocks", "gauge", "Blocks admitted by clients.", static_cast<double>(s.blocks));
  x.Metric("cxltier_ghosts", "gauge", "Block states kept after release (persist).",
           static_cast<double>(s.ghosts));
  x.Metric("cxltier_ghost_restores_total", "counter", "Admissions that got a ghost's state back.",
           static_cast<double>(s.ghost_restores));
  x.Metric("cxltier_observations_total", "counter",
           "Observations folded, through shared memory and socket reports.",
           static_cast<double>(s.observations));
  x.Metric("cxltier_bad_observations_total", "counter",
           "Observations refused or folded as nothing (NaN, negative, implausible totals).",
           static_cast<double>(s.bad_observations));
  x.Metric("cxltier_client_warnings_total", "counter",
           "Lines about clients that were logged (at most 20 per uid per 10 s).",
           static_cast<double>(s.warnings_logged));
  x.Metric("cxltier_client_warnings_suppressed_total", "counter",
           "Lines about clients beyond the per-uid rate, counted instead of logged.",
           static_cast<double>(s.warnings_suppressed));
  const server::ServerCounters& sc = s.server;
  x.Family("cxltier_connections_closed_total", "counter",
           "Connections the daemon closed: replies left unread, a frame too slow, idle "
           "without hello.");
  x.Sample("cxltier_connections_closed_total", static_cast<double>(sc.stalled_closed),
           "reason=\"stalled_replies\"");
  x.Sample("cxltier_connections_closed_total", static_cast<double>(sc.frame_timeouts),
           "reason=\"frame_timeout\"");
  x.Sample("cxltier_connections_closed_total", static_cast<double>(sc.idle_closed),
           "reason=\"idle\"");
  x.Metric("cxltier_accept_backoffs_total", "counter",
           "Accepts that failed for want of fds or memory, followed by a back-off.",
           static_cast<double>(sc.accept_backoffs));
  x.Metric("cxltier_fds_dropped_total", "counter",
           "Messages whose passed fds the kernel dropped (the daemon out of fds).",
           static_cast<double>(sc.fds_dropped));
  x.Metric("cxltier_handler_exceptions_total", "counter",
           "Exceptions caught around a request (answered internal).",
           static_cast<double>(sc.handler_exceptions));
  x.Metric("cxltier_connections", "gauge", "Connected sessions, operator tools included.",
           static_cast<double>(s.connections));
  x.Metric("process_resident_memory_bytes", "gauge", "Resident memory of cxltierd.",
           static_cast<double>(s.memory.rss_bytes));
  return x.Take();
}

}  // namespace cxltier::service
