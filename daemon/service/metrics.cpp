// The Prometheus exposition of the daemon's state (text format 0.0.4).
// Names and units follow the Prometheus conventions: base units (bytes,
// seconds), `_total` for counters, one HELP and TYPE line per family.
#include <cstring>
#include <string>

#include "daemon.h"
#include "fmt/format.h"

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

std::string Daemon::MetricsText() const {
  const engine::EngineCounters c = engine_ ? engine_->counters() : engine::EngineCounters{};
  Exposition x;
  uint64_t clients = 0, blocks = 0, observations = 0, bad = 0;
  for (const auto& [id, cl] : clients_) {
    clients += cl.hello && !cl.leaving;
    blocks += cl.live;
    observations += cl.observations;
    bad += cl.bad_observations;
  }
  const uint64_t bb = engine_ ? engine_->options().block_bytes : 0;
  x.Family("cxltier_tier_blocks", "gauge", "Blocks resident in each tier (0 DRAM, 1 CXL/slow).");
  for (int t = 0; t < 2; ++t) {
    const uint64_t n = engine_ ? engine_->tier_blocks(t == 0 ? Tier::kFast : Tier::kSlow) : 0;
    x.Sample("cxltier_tier_blocks", static_cast<double>(n), fmt::format("tier=\"{}\"", t));
  }
  x.Family("cxltier_tier_bytes", "gauge", "Bytes of KV blocks resident in each tier.");
  for (int t = 0; t < 2; ++t) {
    const uint64_t n = engine_ ? engine_->tier_blocks(t == 0 ? Tier::kFast : Tier::kSlow) : 0;
    x.Sample("cxltier_tier_bytes", static_cast<double>(n * bb), fmt::format("tier=\"{}\"", t));
  }
  x.Metric("cxltier_tier0_budget_bytes", "gauge", "Bytes of tier 0 cxltier may fill.",
           static_cast<double>(config_.tier0_budget_bytes));
  x.Metric("cxltier_block_bytes", "gauge", "Bytes of one KV block.", static_cast<double>(bb));
  x.Metric("cxltier_touches_total", "counter", "Block touches folded (one per block per tick).",
           static_cast<double>(c.touches));
  x.Metric("cxltier_hits_total", "counter", "Touches of blocks that were in tier 0.",
           static_cast<double>(c.hits));
  x.Metric("cxltier_hit_ratio", "gauge", "hits_total / touches_total since start.",
           c.touches ? static_cast<double>(c.hits) / static_cast<double>(c.touches) : 0.0);
  x.Metric("cxltier_promotions_total", "counter", "Verified moves from tier 1 to tier 0.",
           static_cast<double>(c.promotions));
  x.Metric("cxltier_demotions_total", "counter", "Verified moves from tier 0 to tier 1.",
           static_cast<double>(c.demotions));
  x.Metric("cxltier_promoted_bytes_total", "counter", "Bytes moved from tier 1 to tier 0.",
           static_cast<double>(c.promoted_bytes));
  x.Metric("cxltier_demoted_bytes_total", "counter", "Bytes moved from tier 0 to tier 1.",
           static_cast<double>(c.demoted_bytes));
  x.Metric("cxltier_migration_failed_moves_total", "counter",
           "Block moves that did not complete (retried with backoff).",
           static_cast<double>(moves_failed_));
  x.Family("cxltier_migration_failures_total", "counter",
           "Pages or calls that failed to move, by errno.");
  for (auto [e, n] : move_errors_) {
    x.Sample("cxltier_migration_failures_total", static_cast<double>(n),
             fmt::format("errno=\"{}\"", ErrnoName(e)));
  }
  x.Metric("cxltier_pages_wrong_node_total", "counter",
           "Pages verification found on another node than the move's target.",
           static_cast<double>(pages_elsewhere_));
  x.Metric("cxltier_pages_busy_total", "counter", "Pages that could not move (EBUSY: pinned).",
           static_cast<double>(pages_busy_));
  x.Metric("cxltier_pages_verified_total", "counter", "Pages verified on their target node.",
           static_cast<double>(pages_moved_));
  x.Metric("cxltier_pending_moves", "gauge", "Moves queued or running in the mover.",
           static_cast<double>(mover_->pending()));
  x.Family("cxltier_tick_duration_seconds", "histogram", "Duration of one fold + plan tick.");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < tick_seconds_.buckets.size(); ++i) {
    cumulative += tick_seconds_.buckets[i];
    const std::string le = i < TickTimes::kBounds.size() ? fmt::format("{}", TickTimes::kBounds[i])
                                                         : std::string("+Inf");
    x.Sample("cxltier_tick_duration_seconds_bucket", static_cast<double>(cumulative),
             "le=\"" + le + "\"");
  }
  x.Sample("cxltier_tick_duration_seconds_sum", tick_seconds_.sum);
  x.Sample("cxltier_tick_duration_seconds_count", static_cast<double>(tick_seconds_.count));
  x.Metric("cxltier_clients", "gauge", "Clients that said hello.", static_cast<double>(clients));
  x.Metric("cxltier_blocks", "gauge", "Blocks admitted by clients.", static_cast<double>(blocks));
  x.Metric("cxltier_ghosts", "gauge", "Block states kept after release (persist).",
           static_cast<double>(engine_ ? engine_->ghosts().size() : pending_ghosts_.size()));
  x.Metric("cxltier_ghost_restores_total", "counter", "Admissions that got a ghost's state back.",
           static_cast<double>(c.ghost_restores));
  x.Metric("cxltier_observations_total", "counter",
           "Observations folded, through shared memory and socket reports.",
           static_cast<double>(observations));
  x.Metric("cxltier_bad_observations_total", "counter",
           "Observations refused or folded as nothing (NaN, negative, implausible totals).",
           static_cast<double>(bad));
  x.Metric("cxltier_client_warnings_total", "counter",
           "Warnings clients caused that were logged (at most 10 per client per 10 s).",
           static_cast<double>(warnings_.logged()));
  x.Metric("cxltier_client_warnings_suppressed_total", "counter",
           "Warnings clients caused beyond the per-client rate, counted instead of logged.",
           static_cast<double>(warnings_.suppressed()));
  const server::ServerCounters sc =
      server_counters_ ? server_counters_() : server::ServerCounters{};
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
           static_cast<double>(connections_));
  const nlohmann::json mem = MemoryJson();
  x.Metric("process_resident_memory_bytes", "gauge", "Resident memory of cxltierd.",
           static_cast<double>(mem["rss_bytes"].get<uint64_t>()));
  return x.Take();
}

}  // namespace cxltier::service
