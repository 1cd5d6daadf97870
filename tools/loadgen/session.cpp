#include "session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace cxltier::loadgen {

const std::vector<int>& TierNodes::of(uint8_t t) const {
  static const std::vector<int> kNone;
  return t < by_tier.size() ? by_tier[t] : kNone;
}

Session::Session(const Options& options)
    : opt(options),
      model{"loadgen", static_cast<uint32_t>(options.block_bytes / 8192), 1, 1, 128, 2, 16},
      page(static_cast<uint64_t>(sysconf(_SC_PAGESIZE))),
      stride((options.block_bytes + page - 1) / page * page),
      length(stride * options.blocks),
      held_room(options.copy
                    ? static_cast<uint32_t>(options.checks.readers) * options.checks.hold_leases
                    : 0) {}

int Session::Connect() {
  Status st;
  client = Client::Connect({opt.socket_path, model, opt.blocks + held_room, opt.name}, &st);
  if (!client) return Fail(st.message);
  std::string text;
  if (client->Stats("tiers", &text).ok()) {
    const nlohmann::json t = nlohmann::json::parse(text, nullptr, false);
    if (t.is_array()) {
      for (const auto& tier : t) {
        const size_t k = tier["tier"].get<size_t>();
        if (k >= kMaxTiers) continue;
        if (nodes.by_tier.size() <= k) nodes.by_tier.resize(k + 1);
        for (const auto& n : tier["nodes"]) {
          nodes.by_tier[k].push_back(n["node"].get<int>());
          (k == 0 ? nodes.fast : nodes.slow).push_back(n["node"].get<int>());
        }
      }
    }
  }
  nodes.by_tier.resize(std::max<size_t>(nodes.by_tier.size(), 2));
  return 0;
}

bool Session::KernelKnows(uint8_t t) const {
  return opt.devdax.empty() || t + 1u < client->tiers();
}

Status Session::Call(const std::function<Status()>& fn) {
  Status s = fn();
  if (s.ok() || !opt.reconnect) return s;
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
}

nlohmann::json Session::Migrations() {
  std::string text;
  if (!Call([&] { return client->Stats("status", &text); }).ok()) {
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
}

uint64_t Session::Moved(const nlohmann::json& now, const char* k) const {
  return now.value(k, uint64_t{0}) -
         std::min(now.value(k, uint64_t{0}), mig_before.value(k, uint64_t{0}));
}

bool Session::MovesSeen() {
  const nlohmann::json now = Migrations();
  return Moved(now, "promotions") >= opt.until_moves && Moved(now, "demotions") >= opt.until_moves;
}

// Quiet: nothing pending and nothing moved over three ticks. Moved counts
// the released blocks' pages too: one taken by a new block while its pages
// moved down is published where the kernel has them only at the tick after
// that move ends (MoveDispatch::ResolveStale, counted in stale_scans), so a
// check right after the move could see a block published in tier 0 with its
// pages below.
bool Session::WaitQuiet() {
  const auto released_moved = [](const nlohmann::json& m) {
    return m.contains("released_pages") ? m["released_pages"].value("moved", uint64_t{0})
                                        : uint64_t{0};
  };
  for (int wait = 0; wait < 600; ++wait) {
    const nlohmann::json a = Migrations();
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * client->tick_ms() + 10));
    const nlohmann::json b = Migrations();
    if (b.value("pending", uint64_t{1}) == 0 &&
        a.value("promotions", 0) == b.value("promotions", 0) &&
        a.value("demotions", 0) == b.value("demotions", 0) &&
        a.value("failed", 0) == b.value("failed", 0) &&
        a.value("stale_scans", 0) == b.value("stale_scans", 0) &&
        released_moved(a) == released_moved(b)) {
      return true;
    }
  }
  return false;
}

bool Session::TiersSeen() const {
  std::vector<bool> seen(opt.expect_tiers, false);
  for (const auto& [k, v] : live) {
    const size_t t = TierIndex(client->TierOf(v.second));
    if (t < seen.size()) seen[t] = true;
  }
  return std::find(seen.begin(), seen.end(), false) == seen.end();
}

// With --expect-tiers, --until-moves also waits until the daemon has
// published live blocks in each of the tiers checked at the end: where a
// pass stops decides how many blocks are live, and too few fit in the
// upper tiers. The tiers are checked on the quiet daemon: with no new
// touches a settling daemon may promote a lower tier's last blocks, and
// then the run goes on (quiet_rounds counts the times).
bool Session::UntilMet() {
  if (!MovesSeen()) return false;
  if (opt.expect_tiers == 0) return true;
  if (!TiersSeen()) return false;
  if (!opt.check_placement) return true;
  WaitQuiet();
  if (TiersSeen()) return true;
  ++quiet_rounds;
  return false;
}

}  // namespace cxltier::loadgen
