// What the daemon's requests (service/requests.h) and its tick
// (service/daemon.h) share: the configuration, the engine, the clients, the
// moves, the recorder, the quotas and the hint budgets, plus the few
// operations both sides run on them (build the engine, release a block, log
// a line about a client). A plain struct: Daemon owns it, Requests and the
// tick work on it. Everything here runs on the I/O thread.
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "numa/topology.h"
#include "server/log_limiter.h"
#include "server/server.h"
#include "service/admin.h"
#include "service/checkpointer.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/devdax_reservations.h"
#include "service/fold.h"
#include "service/hints.h"
#include "service/move_dispatch.h"
#include "service/quotas.h"
#include "service/recorder.h"
#include "service/status.h"

namespace cxltier::service {

struct Shared {
  Shared(boost::asio::io_context& io, DaemonConfig config, numa::Topology topology,
         numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator, bool can_migrate);
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  // --- Operations both the requests and the tick run ---

  // The engine for blocks of `block_bytes`, built on the first hello (or at
  // start with [engine] block_bytes) from the ghosts loaded so far; kGeometry
  // when another size is in use.
  // *rebuilt: the ghosts a change of block size carried into a new engine.
  Status EnsureEngine(uint64_t block_bytes, uint64_t* rebuilt = nullptr);
  // Releases the block at a live slot in the engine (cancelling its queued
  // move) and frees the slot.
  void ReleaseSlot(Client& c, uint32_t seg_slot);
  // Sets the engine's quotas from config and the connected clients
  // (Quotas::Apply); nothing before there is an engine.
  void ApplyQuotas();
  // Switches the placement policy (kBadPayload: no such policy).
  Status SetPolicy(const std::string& policy);
  // Applies what can change at run time: tick, rate, log level, checkpoint
  // interval, pending-move limit, admin group, lease timeout, quotas and the
  // policy.
  void Reload(const DaemonConfig& next);
  // The ghosts (those loaded while there is no engine yet), and with
  // `with_live` every live block's state too.
  GhostSnapshot CollectGhosts(bool with_live) const;

  // A warning caused by a client, rate-limited per uid with every other
  // line about its clients; and an info line about a client of `peer`.
  void ClientWarning(const server::Peer& peer, const std::string& what);
  void ClientInfo(const server::Peer& peer, const std::string& line);
  // ClientWarning for the parts that know a Client.
  MoveDispatch::Warn ClientWarner();

  // The engine's tiers on this host: 2, or every tier the topology found.
  size_t TierCount() const;
  // Bytes of memory of tier k's nodes (those the topology knows).
  uint64_t TierMemoryBytes(size_t tier) const;
  // Bytes of memory of every node the topology found.
  uint64_t HostMemoryBytes() const;
  // The engine's budgets of tiers 1 .. N-2 (none with two tiers).
  std::vector<uint64_t> LowerTierBudgets() const;
  uint64_t LeaseTimeoutTicks() const;
  // Root or a member of admin_group (service/admin.h), as `admins` last
  // found it.
  bool IsAdmin(const server::Peer& peer) {
    return admins.Is(peer, config.admin_group, AdminCache::Clock::now());
  }
  // The tick an admit or release belongs to in a recording: between ticks the
  // next one. It happened after the last tick's plan and before the next
  // tick's fold, as a replay's event at a step comes after the plan that
  // step's first event triggers and before the step's touches.
  uint64_t EventTick() const { return in_tick ? tick : tick + 1; }

  // --- The state ---

  boost::asio::io_context& io;
  DaemonConfig config;
  numa::Topology topology;
  bool can_migrate;  // page mode: move_pages to a slow node
  bool copy_moves;   // copy mode
  ClientTable clients;
  Recorder recorder;  // cxltierctl record
  Fold fold{&recorder};
  MoveDispatch moves;
  std::unique_ptr<engine::Engine> engine;
  // The quotas set in engine, and copy mode's tier pools under them.
  Quotas quotas;
  // Each uid's budget of I/O-thread work: hints, Stats blocks and hellos spend it.
  UidBudgets budgets;
  AdminCache admins;  // who is root or in admin_group, for a few seconds
  // Device-DAX tier pools' regions, kept for their processes (Daemon::Start
  // gives it its file in the state directory).
  DevdaxReservations devdax;
  Hints hints{&fold, &recorder, &budgets};  // Hint requests
  // Loaded from the checkpoint before the engine exists (with the uid of
  // each, kUnknownOwner when not known); the first engine takes them.
  GhostSnapshot pending_ghosts;
  // Lines about clients (warnings, hello, left, pools), the server's too: 20
  // per uid per 10 s, however many connections the uid opens.
  server::PeerLog peer_log{20, std::chrono::seconds(10)};
  uint64_t tick = 0;
  bool in_tick = false;  // inside the tick's fold .. checkpoint
  bool stopped = false;  // Daemon::Stop ran: every block keeps its place

  // What only status reports.
  TickTimes tick_seconds;
  uint64_t restored_from_checkpoint = 0;
  std::string metrics_endpoint;                             // "" when off
  std::function<server::ServerCounters()> server_counters;  // the server's, when set
};

}  // namespace cxltier::service
