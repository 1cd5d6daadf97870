#include "report.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

namespace cxltier::loadgen {
namespace {

// The copy-mode checks' part of the summary.
nlohmann::json LeaseChecks(const Session& s, const Results& r) {
  const CheckCounts& seen = r.verified.seen;
  const CheckOptions& checks = s.opt.checks;
  // This run's share of a counter of the daemon's copy mode.
  auto copy_counter = [&](const char* k) {
    auto in = [k](const nlohmann::json& m) {
      return m.contains("copy") ? m["copy"].value(k, uint64_t{0}) : uint64_t{0};
    };
    return in(r.mig_after) - std::min(in(r.mig_after), in(s.mig_before));
  };
  return {{"torn", seen.torn},
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
          {"writers", checks.writers}};
}

}  // namespace

nlohmann::json Summary(const Session& s, const Results& r) {
  const WorkloadCounts& c = r.counts;
  const Placement& p = r.placement;
  const Verified& v = r.verified;
  auto delta = [&](const char* k) { return s.Moved(r.mig_after, k); };
  auto copies_in = [](const nlohmann::json& m) {
    return m.contains("copy") ? m["copy"].value("copies", uint64_t{0}) : uint64_t{0};
  };
  const uint64_t copies =
      copies_in(r.mig_after) - std::min(copies_in(r.mig_after), copies_in(s.mig_before));
  return {
      {"touches", c.touches},
      {"hits", c.hits},
      {"hit_rate", c.touches ? static_cast<double>(c.hits) / c.touches : 0.0},
      {"admitted", c.admitted},
      {"released", c.released},
      {"dropped_touches", c.dropped},
      {"bytes_promoted", delta("promoted_bytes")},
      {"bytes_demoted", delta("demoted_bytes")},
      {"promotions", delta("promotions")},
      {"demotions", delta("demotions")},
      {"migration_failures", delta("failed")},
      {"restored", c.restored},
      {"reconnects", s.reconnects},
      {"restored_on_reconnect", s.restored_on_reconnect},
      {"fd_growth", static_cast<int64_t>(CountFds()) - static_cast<int64_t>(s.fds_at_start)},
      {"state_segments_mapped", CountSegmentMaps()},
      {"placement_checked", p.checked},
      {"placement_mismatches", p.mismatches},
      {"kernel_blocks_fast", p.kernel_fast},
      {"kernel_blocks_slow", p.kernel_slow},
      {"kernel_blocks_by_tier", p.kernel_by_tier},
      {"tier_nodes", s.nodes.by_tier},
      {"slow_nodes", s.nodes.slow},
      {"pgmigrate_success", r.pgmigrate},
      {"live_blocks_fast", r.blocks_fast},
      {"live_blocks_slow", r.blocks_slow},
      {"blocks_verified", v.verified},
      {"corrupt_blocks", v.corrupt},
      {"stale_blocks", v.stale},
      {"torn_reads", s.readers ? s.readers->bad_reads() : 0},
      {"lease_reads", v.seen.reads},
      {"reader_failures", v.seen.failed},
      {"lease_checks", LeaseChecks(s, r)},
      {"pinned", s.opt.pin},
      {"pool_pages_off_node_before_pin", s.off_node_before_pin},
      {"pool_pages_off_node_after_pin", s.off_node_after_pin},
      {"pools_pinned", delta("pools_pinned")},
      {"copies", copies},
      {"block_bytes", s.opt.block_bytes},
      {"pool", s.opt.pool_kind},
      {"seconds", r.seconds},
      {"passes", c.passes},
      {"quiet_rounds", s.quiet_rounds},
      {"hints",
       {{"sent", c.hints_sent},
        {"applied", c.hints_applied},
        {"keys_grouped", c.hint_keys_grouped},
        {"keys_unknown", c.hint_keys_unknown},
        {"events_skipped", c.hint_events_skipped},
        {"blocks_prefetched", delta("hint_prefetched")},
        {"blocks_displaced", delta("hint_displaced")}}},
  };
}

void PrintSummary(const Session& s, const Results& r, const nlohmann::json& out) {
  if (s.opt.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  const WorkloadCounts& c = r.counts;
  const Verified& v = r.verified;
  std::cout << fmt::format(
      "cxltier-loadgen: {} touches, {} hits ({:.1f}%), {} admitted, {} released\n"
      "  moved: {} promoted, {} demoted ({} failed moves)\n"
      "  now: {} live blocks in tier 0, {} in slower tiers\n"
      "  verified {} blocks of {}: {} corrupt\n",
      c.touches, c.hits, c.touches ? 100.0 * c.hits / c.touches : 0.0, c.admitted, c.released,
      FormatBytes(out["bytes_promoted"].get<uint64_t>()),
      FormatBytes(out["bytes_demoted"].get<uint64_t>()), out["migration_failures"].get<uint64_t>(),
      r.blocks_fast, r.blocks_slow, v.verified, FormatBytes(s.opt.block_bytes), v.corrupt);
  if (s.opt.hints) {
    std::cout << fmt::format("  hints: {} sent ({} applied), {} blocks prefetched, {} displaced\n",
                             c.hints_sent, c.hints_applied,
                             out["hints"]["blocks_prefetched"].get<uint64_t>(),
                             out["hints"]["blocks_displaced"].get<uint64_t>());
  }
  if (s.opt.copy) {
    const CheckCounts& seen = v.seen;
    std::cout << fmt::format(
        "  copy mode: {} reads under leases, {} torn, {} stale, {} failed\n"
        "  {} leases held {} ticks ({} of moved blocks, {} of released ones, {} across a "
        "reconnect): {} changed\n"
        "  {} rewrites ({} over a copy): {} stale blocks at the end\n",
        seen.reads, seen.torn, seen.stale, seen.failed, seen.holds, s.opt.checks.hold_ticks,
        seen.held_moved, seen.held_released, seen.held_across_reconnect, seen.changed,
        seen.rewrites, seen.rewrites_over_copy, v.stale);
  }
}

}  // namespace cxltier::loadgen
