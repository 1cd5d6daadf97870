// What the parts of a run share: the options, the client and the daemon's
// tiers, the pools, the live blocks, and the calls to the daemon (with
// --reconnect, through Call, which reconnects when the daemon went away).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "copy_mode.h"
#include "cxltier/client.h"
#include "cxltier/model.h"
#include "options.h"

namespace cxltier::loadgen {

// The daemon's tiers: which nodes the kernel should show each tier's pages
// on. slow: those of every tier but 0.
struct TierNodes {
  std::vector<std::vector<int>> by_tier;
  std::vector<int> fast, slow;
  const std::vector<int>& of(uint8_t t) const;
};

struct Session {
  explicit Session(const Options& options);
  // Connects (blocks + held_room) and asks for the daemon's tiers.
  int Connect();
  // Device-DAX memory is no node's: the kernel cannot say where it is.
  bool KernelKnows(uint8_t t) const;

  // Every call to the daemon goes through here: with --reconnect, a failed
  // call waits for the daemon to come back, reconnects and is tried again.
  Status Call(const std::function<Status()>& fn);
  // The daemon's migration (and hint) totals.
  nlohmann::json Migrations();
  // This run's share of a daemon counter (other clients may share the daemon).
  uint64_t Moved(const nlohmann::json& now, const char* k) const;
  bool MovesSeen();
  // Waits until the daemon is quiet: nothing pending and no move completed
  // across three ticks (blocks held by hysteresis may still move after we stop).
  bool WaitQuiet();
  // Whether live blocks sit in each of the --expect-tiers tiers.
  bool TiersSeen() const;
  // Whether a --until-moves run may stop.
  bool UntilMet();

  const Options& opt;
  // A geometry whose block is exactly --block-bytes: one KV head of dim 128, fp16.
  ModelGeometry model;
  uint64_t page, stride, length;
  // Copy mode: a place (and a slot, after a reconnect: the library's parked
  // key) is kept for every lease a hold has on a block that moved or was
  // released, beyond the blocks live at once: that room is ours to give.
  uint32_t held_room;

  std::unique_ptr<Client> client;
  TierNodes nodes;
  uint32_t pool_id = 0;
  // Page mode: the pool (a memfd's when memfd is not -1).
  int memfd = -1;
  void* pool = nullptr;
  Pin pins;
  uint64_t off_node_before_pin = 0, off_node_after_pin = 0;  // copy mode's tier pools
  std::unique_ptr<Readers> readers;                          // copy mode

  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> live;  // trace key -> (block, slot)
  std::vector<BlockKey> trace_keys;                                  // filled once the trace exists
  // --hints: trace keys already sent to the daemon with a hint of their group
  // (it keeps them in the group until they are released).
  std::vector<uint8_t> hint_sent;

  size_t fds_at_start = 0, segments_at_start = 0;
  uint64_t reconnects = 0, restored_on_reconnect = 0;
  uint64_t quiet_rounds = 0;  // UntilMet's waits for a quiet daemon that fell short
  nlohmann::json mig_before;  // the daemon's migration totals before we start
  uint64_t pgmigrate_before = 0;
};

}  // namespace cxltier::loadgen
