// The daemon's core: clients, their segments and pools, the engine, the tick
// loop (fold observations, plan, hand moves to the mover), ghost checkpoints
// and the stats that cxltierctl reads (snapshot.cpp fills them, status.h
// renders them). Everything here runs on the I/O thread except the mover's
// migrations.
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "config.h"
#include "engine/engine.h"
#include "log_limiter.h"
#include "mover.h"
#include "numa/topology.h"
#include "pool.h"
#include "segment.h"
#include "server.h"
#include "status.h"

namespace cxltier::service {

class Daemon final : public server::Handler {
 public:
  Daemon(boost::asio::io_context& io, DaemonConfig config, numa::Topology topology,
         numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator, bool can_migrate);
  ~Daemon() override;

  // Loads the ghost checkpoint and starts the tick timer. Returns an error or "".
  std::string Start();
  // Stops ticking and moving, turns every live block into a ghost, saves them.
  void Stop();
  // Applies what can change at run time: tick, rate, log level, checkpoint
  // interval, pending-move limit, admin group, and the policy.
  void Reload(const DaemonConfig& config);
  // Switches the placement policy of the running engine. Returns an error or "".
  std::string SetPolicy(const std::string& policy);
  // What an Admin kReload request runs (the daemon's main re-reads its config
  // file); without one, kReload re-applies the running configuration.
  void set_reload_hook(std::function<std::string()> hook) { reload_hook_ = std::move(hook); }
  // The server's counters (connections it closed, accept back-offs...), for
  // status and metrics.
  void set_server_counters(std::function<server::ServerCounters()> f) {
    server_counters_ = std::move(f);
  }
  // Where the metrics server listens (shown in status), or "".
  void set_metrics_endpoint(std::string e) { metrics_endpoint_ = std::move(e); }

  // Logs a warning caused by a client, rate-limited per connection (protocol
  // errors from the server come here too).
  void ClientWarning(const server::Peer& peer, const std::string& what);

  const DaemonConfig& config() const { return config_; }
  // Everything status reports, read once (snapshot.cpp); the views below
  // render it.
  StatusSnapshot Snapshot() const;
  // `Stats status`.
  nlohmann::json StatusJson() const { return StatusToJson(Snapshot()); }
  // The Prometheus text exposition.
  std::string MetricsText() const { return MetricsExposition(Snapshot()); }

  // server::Handler
  std::optional<wire::Error> OnConnect(const server::Peer& peer) override;
  void OnDisconnect(const server::Peer& peer) override;
  server::Answer<wire::HelloOk> OnHello(const server::Peer& peer, const wire::Hello& m,
                                        int* segment_fd) override;
  server::Answer<wire::RegisterPoolOk> OnRegisterPool(const server::Peer& peer,
                                                      const wire::RegisterPool& m,
                                                      server::UniqueFd memfd) override;
  server::Answer<wire::AdmitOk> OnAdmit(const server::Peer& peer, const wire::Admit& m) override;
  server::Answer<wire::ReleaseOk> OnRelease(const server::Peer& peer,
                                            const wire::Release& m) override;
  server::Answer<wire::ReportOk> OnReport(const server::Peer& peer, const wire::Report& m) override;
  server::Answer<wire::QueryTiersOk> OnQueryTiers(const server::Peer& peer,
                                                  const wire::QueryTiers& m) override;
  server::Answer<wire::StatsOk> OnStats(const server::Peer& peer, const wire::Stats& m) override;
  server::Answer<wire::AdminOk> OnAdmin(const server::Peer& peer, const wire::Admin& m) override;

  // One round: fold, plan, hand out moves, write back. Public for tests.
  void Tick();

 private:
  struct SegSlot {
    bool live = false;
    engine::Slot engine_slot = engine::kNoSlot;
    uint32_t pool = 0;
    uint32_t block = 0;
    BlockKey key;                 // as the client named it
    uint32_t socket_touches = 0;  // socket reports since the last fold
    double socket_mass = 0;
  };
  // What the fold reads for every slot every tick, kept apart from SegSlot so
  // the scan of a million slots touches 8 bytes here and the client's line.
  struct FoldState {
    uint32_t seen_touches = 0;  // the client's running totals at the last fold
    uint32_t seen_mass_q16 = 0;
  };
  struct Client {
    server::Peer peer;
    uint64_t id = 0;
    std::string name;
    bool hello = false;
    ModelGeometry model;
    server::Segment segment;
    std::vector<server::Pool> pools;
    std::vector<SegSlot> slots;
    std::vector<uint8_t> live_slots;  // slots[i].live, packed for the fold's scan
    std::vector<FoldState> fold;
    std::vector<uint64_t> socket_dirty;  // slots with socket reports to fold, a bit each
    std::vector<uint32_t> free_slots;
    std::unordered_map<BlockKey, uint32_t, BlockKeyHash> by_key;
    uint64_t live = 0;
    bool leaving = false;         // disconnected; its slots are being released
    uint32_t release_cursor = 0;  // slots before it are released
    uint64_t bad_observations = 0;
    uint64_t observations = 0;
  };
  // What one uid holds, over all its connections (the per-uid limits).
  struct UidUsage {
    uint32_t connections = 0;
    uint64_t blocks = 0;
    uint32_t pools = 0;
    uint64_t segment_bytes = 0;
  };
  struct Owner {
    uint64_t session = 0;
    uint32_t seg_slot = 0;
  };

  Client* Find(const server::Peer& peer);
  // The connection caps: max_clients (plus the admin reserve) and per uid.
  std::optional<wire::Error> CheckConnectionLimits(const server::Peer& peer, bool admin) const;
  BlockKey EngineKey(const BlockKey& key, uid_t uid) const;
  std::string EnsureEngine(uint64_t block_bytes);
  Tier TierOfNode(int node) const;
  Tier WhereIs(const numa::PageRange& range);
  void ReleaseSlot(Client& c, uint32_t seg_slot);
  void ReleaseLeaving(uint64_t session);
  void WriteBack(Client& c, uint32_t seg_slot);
  void FoldSlot(Client& c, uint32_t seg_slot);
  void FoldBatch(Client& c);
  void RunTick();
  void DropGonePools();
  void OnMoveDone(MoveDone done);
  void ScheduleTick();
  void Checkpoint();
  GhostSnapshot CollectGhosts() const;
  std::string GhostPath() const;
  // The views of Stats (snapshot.cpp). Clients and blocks: every client's
  // (admins), or only those of uid `only`.
  std::vector<TierStatus> TierStatuses() const;
  std::vector<ClientStatus> ClientStatuses(std::optional<uid_t> only) const;
  BlockRanking RankBlocks(std::optional<uid_t> only) const;

  boost::asio::io_context& io_;
  DaemonConfig config_;
  numa::Topology topology_;
  numa::TierAssignment tiers_;
  bool can_migrate_;
  std::unique_ptr<Mover> mover_;
  // The mover moves with it on its thread; the I/O thread asks it Where().
  std::shared_ptr<numa::Migrator> migrator_;
  std::unique_ptr<engine::Engine> engine_;
  std::vector<BlockState> pending_ghosts_;      // loaded before the engine exists
  std::vector<uint32_t> pending_ghost_owners_;  // the uid of each (kUnknownOwner: not known)
  std::unique_ptr<CheckpointWriter> checkpoint_writer_;  // null: checkpoints written inline
  std::map<uint64_t, Client> clients_;                   // by session id
  std::unordered_map<uid_t, UidUsage> uids_;             // of the connected clients
  // Warnings a client causes: 10 per connection per 10 s.
  server::LogLimiter warnings_{10, std::chrono::seconds(10)};
  std::vector<Owner> owners_;         // by engine slot
  std::vector<uint32_t> fold_batch_;  // Tick's scratch: segment slots to fold
  std::function<std::string()> reload_hook_;
  std::function<server::ServerCounters()> server_counters_;
  TickTimes tick_seconds_;
  std::string metrics_endpoint_;
  boost::asio::steady_timer timer_;
  uint64_t tick_ = 0;
  uint64_t moves_in_flight_ = 0;
  uint64_t connections_ = 0;  // connected sessions (clients_ also holds ones leaving)  // submitted
                              // to the mover, OnMoveDone not yet run
  uint64_t next_client_id_ = 1;
  uint64_t last_checkpoint_tick_ = 0;
  bool stopped_ = false;
  // Migration outcomes beyond the engine's counters.
  uint64_t moves_failed_ = 0;
  uint64_t pages_busy_ = 0;
  uint64_t pages_elsewhere_ = 0;
  uint64_t pages_moved_ = 0;   // verified on their target node after a move
  uint64_t pages_absent_ = 0;  // not present: never faulted in by the client
  std::map<int, uint64_t> move_errors_;
  uint64_t restored_from_checkpoint_ = 0;
  std::string last_checkpoint_error_;
};

}  // namespace cxltier::service
