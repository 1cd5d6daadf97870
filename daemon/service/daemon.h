// The daemon: answers the clients' requests and runs the tick (fold the
// observations, plan, dispatch the moves, checkpoint). Its parts: the client
// table (clients, slots, key and owner indexes), the fold, move dispatch
// (and the mover's thread), the checkpointer, and the status snapshot
// (snapshot.cpp fills it, status.h renders it). Everything here runs on the
// I/O thread except the mover's migrations and the checkpoint writes.
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "numa/topology.h"
#include "server/log_limiter.h"
#include "server/server.h"
#include "service/checkpointer.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/fold.h"
#include "service/hints.h"
#include "service/move_dispatch.h"
#include "service/quotas.h"
#include "service/status.h"

namespace cxltier::service {

class Daemon final : public server::Handler {
 public:
  Daemon(boost::asio::io_context& io, DaemonConfig config, numa::Topology topology,
         numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator, bool can_migrate);
  ~Daemon() override;

  // Loads the ghost checkpoint and starts the tick timer.
  Status Start();
  // Stops ticking and moving, turns every live block into a ghost, saves them.
  void Stop();
  // Applies what can change at run time: tick, rate, log level, checkpoint
  // interval, pending-move limit, admin group, and the policy.
  void Reload(const DaemonConfig& config);
  // Switches the placement policy of the running engine (kBadPayload: no
  // such policy).
  Status SetPolicy(const std::string& policy);
  // What Reload cannot take from `config` on this host (a quota capping the
  // last tier or a tier the host lacks); main checks it before Reload.
  Status CheckReload(const DaemonConfig& config) const;
  // The engine's tiers on this host: 2, or every tier the topology found.
  size_t TierCount() const;
  // What an Admin kReload request runs (the daemon's main re-reads its config
  // file); without one, kReload re-applies the running configuration.
  void set_reload_hook(std::function<Status()> hook) { reload_hook_ = std::move(hook); }
  // The server's counters (connections it closed, accept back-offs...), for
  // status and metrics.
  void set_server_counters(std::function<server::ServerCounters()> f) {
    server_counters_ = std::move(f);
  }
  // Where the metrics server listens (shown in status), or "".
  void set_metrics_endpoint(std::string e) { metrics_endpoint_ = std::move(e); }

  // Logs a warning caused by a client (protocol errors from the server come
  // here too), rate-limited per uid with every other line about its clients.
  void ClientWarning(const server::Peer& peer, const std::string& what);
  // Where every line about a client goes, the server's too (main passes it).
  server::PeerLog& peer_log() { return peer_log_; }

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
  server::Answer<wire::CreateTierPoolOk> OnCreateTierPool(const server::Peer& peer,
                                                          const wire::CreateTierPool& m,
                                                          server::UniqueFd fd,
                                                          int* pool_fd) override;
  server::Answer<wire::AdmitOk> OnAdmit(const server::Peer& peer, const wire::Admit& m) override;
  server::Answer<wire::ReleaseOk> OnRelease(const server::Peer& peer,
                                            const wire::Release& m) override;
  server::Answer<wire::ReportOk> OnReport(const server::Peer& peer, const wire::Report& m) override;
  server::Answer<wire::HintOk> OnHint(const server::Peer& peer, const wire::Hint& m) override;
  server::Answer<wire::QueryTiersOk> OnQueryTiers(const server::Peer& peer,
                                                  const wire::QueryTiers& m) override;
  server::Answer<wire::StatsOk> OnStats(const server::Peer& peer, const wire::Stats& m) override;
  server::Answer<wire::AdminOk> OnAdmin(const server::Peer& peer, const wire::Admin& m,
                                        server::UniqueFd* reply_fd) override;
  std::chrono::microseconds Throttle(const server::Peer& peer) override;

  // One round: fold, plan, hand out moves, write back. Public for tests.
  void Tick();

 private:
  Client* Find(const server::Peer& peer) { return clients_.Find(peer.session_id); }
  // The engine for blocks of `block_bytes` (kGeometry: another size is in use).
  Status EnsureEngine(uint64_t block_bytes);
  // Releases the block at a live slot in the engine (cancelling its queued
  // move) and frees the slot.
  void ReleaseSlot(Client& c, uint32_t seg_slot);
  // An admit into a client's tier pools (copy mode), checked.
  server::Answer<wire::AdmitOk> AdmitCopy(Client& c, const wire::Admit& m);
  // ClientWarning for the parts that know a Client.
  MoveDispatch::Warn ClientWarner();
  // An info line about a client of `peer` (it names the uid), rate-limited per uid.
  void ClientInfo(const server::Peer& peer, const std::string& line);
  uint64_t LeaseTimeoutTicks() const;
  void ReleaseLeaving(uint64_t session);
  // Sets the engine's quotas from config_ and the connected clients
  // (Quotas::Apply); nothing before there is an engine.
  void ApplyQuotas();
  // Admin kSetQuota: parses, checks and applies one account's quota.
  server::Answer<wire::AdminOk> SetQuotaRequest(const std::string& arg);
  // Every user's (and every quota-holding client's) share and quota (snapshot.cpp).
  QuotaStatus QuotaStatuses() const;
  // cxltierctl record (recording.cpp).
  server::Answer<wire::AdminOk> StartRecording(const std::string& arg);
  server::Answer<wire::AdminOk> StopRecording(server::UniqueFd* trace_fd);
  void RunTick();
  void ScheduleTick();
  void DropGonePools();
  void Checkpoint();
  // The ghosts (those loaded while there is no engine yet), and with
  // `with_live` every live block's state too.
  GhostSnapshot CollectGhosts(bool with_live) const;
  // The views of Stats (snapshot.cpp): "status", "tiers", "clients",
  // "blocks" or "quotas" (nothing for another name). Clients, blocks and the
  // users of status and quotas: every uid's (only = nullopt), or only `only`'s.
  std::optional<nlohmann::json> StatsJson(const std::string& what, std::optional<uid_t> only) const;
  std::vector<TierStatus> TierStatuses() const;
  // Bytes of memory of tier k's nodes (those the topology knows).
  uint64_t TierMemoryBytes(size_t tier) const;
  // The engine's budgets of tiers 1 .. N-2 (none with two tiers).
  std::vector<uint64_t> LowerTierBudgets() const;
  std::vector<ClientStatus> ClientStatuses(std::optional<uid_t> only) const;
  BlockRanking RankBlocks(std::optional<uid_t> only) const;

  boost::asio::io_context& io_;
  DaemonConfig config_;
  numa::Topology topology_;
  bool can_migrate_;  // page mode: move_pages to a slow node
  bool copy_moves_;   // copy mode
  ClientTable clients_;
  Recorder recorder_;  // cxltierctl record
  Fold fold_{&recorder_};
  MoveDispatch moves_;
  Checkpointer checkpoints_;
  std::unique_ptr<engine::Engine> engine_;
  // The quotas set in engine_, and copy mode's tier pools under them.
  Quotas quotas_;
  std::vector<BlockState> pending_ghosts_;      // loaded before the engine exists
  std::vector<uint32_t> pending_ghost_owners_;  // the uid of each (kUnknownOwner: not known)
  // Lines about clients (warnings, hello, left, pools), the server's too: 20
  // per uid per 10 s, however many connections the uid opens.
  server::PeerLog peer_log_{20, std::chrono::seconds(10)};
  std::function<Status()> reload_hook_;
  std::function<server::ServerCounters()> server_counters_;
  TickTimes tick_seconds_;
  std::string metrics_endpoint_;
  boost::asio::steady_timer timer_;
  uint64_t tick_ = 0;
  bool in_tick_ = false;  // inside RunTick
  // The tick an admit or release belongs to in a recording: between ticks the
  // next one. It happened after the last tick's plan and before the next
  // tick's fold, as a replay's event at a step comes after the plan that
  // step's first event triggers and before the step's touches.
  uint64_t EventTick() const { return in_tick_ ? tick_ : tick_ + 1; }
  Hints hints_{&fold_, &recorder_};  // Hint requests and each uid's hint budget
  uint64_t last_checkpoint_tick_ = 0;
  uint64_t restored_from_checkpoint_ = 0;
  bool stopped_ = false;
};

}  // namespace cxltier::service
