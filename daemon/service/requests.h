// The daemon's answers to its clients: the server's handler, one function
// per message. They work on what the daemon shares (service/shared.h) and run
// on the I/O thread, between ticks. requests.cpp holds the clients' messages
// (connect, hello, pools, admit and release, report, hint, query, stats),
// admin.cpp the admins' (policy, reload, quotas), recording.cpp `cxltierctl
// record`.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "server/server.h"
#include "service/shared.h"

namespace cxltier::service {

class Requests final : public server::Handler {
 public:
  explicit Requests(Shared& shared) : d_(shared) {}

  // What an Admin kReload request runs (the daemon's main re-reads its config
  // file); without one, kReload re-applies the running configuration.
  void set_reload_hook(std::function<Status()> hook) { reload_hook_ = std::move(hook); }

  Status OnConnect(const server::Peer& peer) override;
  void OnDisconnect(const server::Peer& peer) override;
  Result<wire::HelloOk> OnHello(const server::Peer& peer, const wire::Hello& m,
                                int* segment_fd) override;
  Result<wire::RegisterPoolOk> OnRegisterPool(const server::Peer& peer, const wire::RegisterPool& m,
                                              server::UniqueFd memfd) override;
  Result<wire::CreateTierPoolOk> OnCreateTierPool(const server::Peer& peer,
                                                  const wire::CreateTierPool& m,
                                                  server::UniqueFd fd, int* pool_fd) override;
  Result<wire::AdmitOk> OnAdmit(const server::Peer& peer, const wire::Admit& m) override;
  Result<wire::ReleaseOk> OnRelease(const server::Peer& peer, const wire::Release& m) override;
  Result<wire::ReportOk> OnReport(const server::Peer& peer, const wire::Report& m) override;
  Result<wire::HintOk> OnHint(const server::Peer& peer, const wire::Hint& m) override;
  Result<wire::QueryTiersOk> OnQueryTiers(const server::Peer& peer,
                                          const wire::QueryTiers& m) override;
  Result<wire::StatsOk> OnStats(const server::Peer& peer, const wire::Stats& m) override;
  Result<wire::AdminOk> OnAdmin(const server::Peer& peer, const wire::Admin& m,
                                server::UniqueFd* reply_fd) override;
  std::chrono::microseconds Throttle(const server::Peer& peer) override;

  // The blocks of pool `pool` of the client of `session`, a pool already
  // marked dead (its process is gone: Daemon::DropGonePools), become
  // ghosts a chunk of slots per turn of the I/O thread, as a client's that
  // left do; the last chunk logs how many. Slots from `from` on.
  void ReleaseDeadPool(uint64_t session, uint32_t pool, uint32_t from = 0, uint64_t released = 0);

 private:
  // The client of `peer` once it said hello, or nullptr.
  Client* Said(const server::Peer& peer);
  // Charges `units` of I/O-thread work to `peer`'s uid (UidBudgets), unless
  // it is root or in the admin group: trusted, as by the connection caps.
  void Charge(const server::Peer& peer, uint64_t units);
  // One new block of a page-mode pool into the engine, placed (requests.cpp).
  // *chosen: the engine placed the block (it had no page yet, and the pool's
  // new pages are steered), for the recording.
  engine::Slot AdmitPage(Client& c, uint32_t pool_id, const wire::AdmitEntry& e, bool* chosen);
  // An admit into a client's tier pools (copy mode), checked.
  Result<wire::AdmitOk> AdmitCopy(Client& c, const wire::Admit& m);
  // Releases a client that left, a chunk of slots per turn of the I/O thread.
  void ReleaseLeaving(uint64_t session);
  // One chunk of those releases (and of ReleaseDeadPool's): from slot
  // *cursor on, at most kReleaseChunk slots looked at, the live ones of
  // `pool` (kAnyPool: of any) released and counted in *released. True when
  // every slot was looked at.
  static constexpr uint32_t kAnyPool = UINT32_MAX;
  bool ReleaseChunk(Client& c, uint32_t* cursor, uint32_t pool, uint64_t* released);
  // Admin kSetQuota: parses, checks and applies one account's quota (admin.cpp).
  Result<wire::AdminOk> SetQuota(const std::string& arg);
  // cxltierctl record (recording.cpp).
  Result<wire::AdminOk> StartRecording(const std::string& arg);
  Result<wire::AdminOk> StopRecording(server::UniqueFd* trace_fd);

  Shared& d_;
  std::function<Status()> reload_hook_;
};

}  // namespace cxltier::service
