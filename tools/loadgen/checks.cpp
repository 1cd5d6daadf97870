#include "checks.h"

#include <numa.h>
#include <numaif.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace cxltier::loadgen {

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

void CountLiveTiers(const Session& s, Results* r) {
  for (const auto& [k, v] : s.live) {
    const Tier t = s.client->TierOf(v.second);
    r->blocks_fast += t == Tier::kFast;
    r->blocks_slow += t != Tier::kFast && t != Tier::kNone;  // any tier below 0
  }
}

namespace {

// A block whose pages are not where the daemon published it: the first few
// are shown, with what the kernel said instead.
void ShowMismatch(uint32_t block, Tier published, size_t on_fast, size_t on_slow,
                  size_t on_published, size_t pages, const std::map<int, size_t>& seen,
                  int call_errno) {
  std::fprintf(stderr,
               "cxltier-loadgen: block %u published %s (tier %u) but the kernel has %zu "
               "pages on fast nodes, %zu on slow nodes and %zu on its tier's of %zu\n",
               block,
               published == Tier::kFast   ? "fast"
               : published == Tier::kNone ? "none"
                                          : "slow",
               TierIndex(published), on_fast, on_slow, on_published, pages);
  // What the kernel said instead: node ids, or -errno per page (-2: not
  // present, -14: not mapped), and the call's own error (then every
  // page still shows the -1 it was given before the call).
  std::string said;
  for (auto [n, count] : seen) said += " " + std::to_string(n) + "x" + std::to_string(count);
  std::fprintf(stderr, "cxltier-loadgen:   move_pages said:%s%s%s\n", said.c_str(),
               call_errno ? "; the call failed: " : "",
               call_errno ? std::strerror(call_errno) : "");
}

// One live block (its pool block and slot): where the kernel has its pages.
void CheckBlock(const Session& s, uint32_t block, uint32_t slot, Placement* p) {
  const Tier published = s.client->TierOf(slot);
  std::vector<void*> pages;
  uint8_t* base = static_cast<uint8_t*>(s.pool) + uint64_t{block} * s.stride;
  if (s.opt.copy) {  // where the daemon published the block to be
    const Location at = s.client->LocationOf(slot);
    base = at.tier < kMaxTiers ? s.client->tier_pool_base(at.tier) + uint64_t{at.index} * s.stride
                               : nullptr;
    if (!base || static_cast<uint8_t>(s.client->TierOf(slot)) != at.tier) {
      ++p->mismatches;
      return;
    }
    if (!s.KernelKnows(at.tier)) {  // in the device: what the daemon published is all we know
      ++p->checked;
      return;
    }
  }
  for (uint64_t off = 0; off < s.opt.block_bytes; off += s.page) pages.push_back(base + off);
  std::vector<int> status(pages.size(), -1);
  const long rc = numa_move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0);
  const int call_errno = rc < 0 ? errno : 0;
  size_t on_fast = 0, on_slow = 0, on_published = 0;
  std::map<int, size_t> seen;  // node (or -errno) -> pages, for the report
  const std::vector<int>& fast = s.nodes.fast;
  const std::vector<int>& slow = s.nodes.slow;
  const std::vector<int>& published_nodes = s.nodes.of(static_cast<uint8_t>(published));
  for (int n : status) {
    on_fast += std::count(fast.begin(), fast.end(), n) > 0;
    on_slow += std::count(slow.begin(), slow.end(), n) > 0;
    on_published += std::count(published_nodes.begin(), published_nodes.end(), n) > 0;
    ++seen[n];
  }
  ++p->checked;
  const bool all_fast = on_fast == pages.size(), all_slow = on_slow == pages.size();
  p->kernel_fast += all_fast;
  p->kernel_slow += all_slow && !p->same_nodes;
  // Every page on the nodes of the tier the daemon published (tier 1
  // and below: that tier's own nodes, not just any slow node).
  const bool ok = p->same_nodes ? (all_fast && published != Tier::kNone)
                                : (published != Tier::kNone && on_published == pages.size());
  if (ok && !p->same_nodes && TierIndex(published) < p->kernel_by_tier.size()) {
    ++p->kernel_by_tier[TierIndex(published)];
  }
  if (!ok) {
    if (p->mismatches < 5) {
      ShowMismatch(block, published, on_fast, on_slow, on_published, pages.size(), seen,
                   call_errno);
    }
    ++p->mismatches;
  }
}

}  // namespace

Placement CheckPlacement(Session& s) {
  Placement p;
  p.kernel_by_tier.assign(s.nodes.by_tier.size(), 0);
  p.same_nodes = s.nodes.fast == s.nodes.slow;
  if (!s.opt.check_placement) return p;
  if (!s.WaitQuiet()) {
    std::fprintf(stderr,
                 "cxltier-loadgen: the daemon kept moving blocks; placement checked anyway\n");
  }
  for (const auto& [k, v] : s.live) CheckBlock(s, v.first, v.second, &p);
  return p;
}

namespace {

// What went wrong with the bytes: corrupt blocks, wrong reads under leases,
// tier pools whose pages are off their nodes.
void BytesFailed(const Session& s, const Results& r, std::vector<std::string>* failed) {
  const Verified& v = r.verified;
  if (v.corrupt) {
    failed->push_back(std::to_string(v.corrupt) + " corrupt blocks (" + std::to_string(v.stale) +
                      " of an older generation than the last write)");
  }
  if (s.readers && s.readers->bad_reads()) {
    failed->push_back(fmt::format(
        "{} torn reads under leases: {} not whole, {} of an older generation than the last "
        "write, {} held leases whose bytes changed while held",
        s.readers->bad_reads(), v.seen.torn, v.seen.stale, v.seen.changed));
  }
  if (s.readers && s.readers->failed()) {
    failed->push_back(std::to_string(s.readers->failed()) + " reader failures (" +
                      s.readers->first_error() + ")");
  }
  if (s.opt.copy && s.opt.check_placement && !r.placement.same_nodes &&
      (s.off_node_before_pin || s.off_node_after_pin)) {
    failed->push_back(fmt::format(
        "tier pool pages off their tier's nodes: {} before pinning, {} after (pinning memory that "
        "is onlined movable migrates it: online CXL memory with --no-movable)",
        s.off_node_before_pin, s.off_node_after_pin));
  }
}

// --expect-tiers: the daemon's tiers with nodes, and blocks the kernel shows on each.
void TiersFailed(const Session& s, const Results& r, std::vector<std::string>* failed) {
  const uint32_t expect_tiers = s.opt.expect_tiers;
  size_t reported = 0;
  for (const std::vector<int>& nodes : s.nodes.by_tier) reported += !nodes.empty();
  if (!s.opt.check_placement || reported < expect_tiers) {
    failed->push_back(
        "expected " + std::to_string(expect_tiers) + " tiers with nodes, the daemon reports " +
        std::to_string(reported) +
        (s.opt.check_placement ? "" : " (and --expect-tiers needs --check-placement)"));
  } else {
    for (uint32_t k = 0; k < expect_tiers; ++k) {
      if (r.placement.kernel_by_tier[k] == 0) {
        failed->push_back("no block the kernel shows on tier " + std::to_string(k) + "'s nodes");
      }
    }
  }
}

// The --expect-* checks and the rest.
void ExpectationsFailed(Session& s, const Results& r, const nlohmann::json& out,
                        std::vector<std::string>* failed) {
  const Options& o = s.opt;
  if (o.expect_pinned) {
    // Moves come back on the daemon's time: wait for its word, up to 60 s.
    bool said = out["pools_pinned"].get<uint64_t>() > 0;
    for (int wait = 0; wait < 600 && !said; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      said = s.Moved(s.Migrations(), "pools_pinned") > 0;
    }
    if (!said) {
      failed->push_back("expected the daemon to report the pinned pool (migrations.pools_pinned)");
    }
  }
  if (o.check_placement && r.placement.mismatches) {
    failed->push_back(std::to_string(r.placement.mismatches) + " blocks not where the daemon says");
  }
  const uint64_t want_moves = std::max<uint64_t>(1, o.until_moves);
  if (o.expect_moves && (out["demotions"].get<uint64_t>() < want_moves ||
                         out["promotions"].get<uint64_t>() < want_moves)) {
    failed->push_back(
        fmt::format("expected at least {} demotions and {} promotions, saw {} and {} "
                    "in {:.1f} s ({} passes)",
                    want_moves, want_moves, out["demotions"].get<uint64_t>(),
                    out["promotions"].get<uint64_t>(), r.seconds, r.counts.passes));
  }
  if (o.expect_restored && r.counts.restored + s.restored_on_reconnect == 0) {
    failed->push_back("expected ghosts to be restored");
  }
  if (o.expect_no_leaks && (out["fd_growth"] != 0 || CountSegmentMaps() != s.segments_at_start)) {
    failed->push_back("leaked: " + out["fd_growth"].dump() + " more fds, " +
                      std::to_string(CountSegmentMaps()) + " state segments mapped (" +
                      std::to_string(s.segments_at_start) + " at start)");
  }
  if (o.expect_slow_tier && s.nodes.slow.empty()) {
    failed->push_back("the daemon reports no slow tier");
  }
  if (o.expect_tiers > 0) TiersFailed(s, r, failed);
  if (r.counts.hint_keys_unknown) {
    failed->push_back(std::to_string(r.counts.hint_keys_unknown) +
                      " keys of our hints were unknown to the daemon (we held them)");
  }
  if (o.expect_kernel_migrations && r.pgmigrate == 0) {
    failed->push_back("pgmigrate_success did not grow");
  }
}

}  // namespace

std::vector<std::string> FailedChecks(Session& s, const Results& r, const nlohmann::json& out) {
  std::vector<std::string> failed;
  BytesFailed(s, r, &failed);
  ExpectationsFailed(s, r, out, &failed);
  return failed;
}

}  // namespace cxltier::loadgen
