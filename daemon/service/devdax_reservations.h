// Device-DAX regions given to clients as tier pools, and who may still read
// them. A client maps the device itself, and that mapping outlives its
// connection: across a disconnect or a daemon restart its held read leases
// still read places in the region. So a region stays reserved while the
// daemon's mapping of it lives (the pool, a copy in flight) and after that
// while the process that made it lives; only that process may take it again
// (its Reconnect). Before this, a region was free once the daemon's mapping
// went, and another connection's copies could overwrite what the first
// one's readers held. Kept in a file in the state directory, so that a
// restarted daemon knows them.
//
// Thread-safety: none; the I/O thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxltier/status.h"
#include "server/pool.h"
#include "server/server.h"

namespace cxltier::service {

class DevdaxReservations {
 public:
  using Region = server::Pool::DevdaxRegion;

  // Where the reservations are kept ("": nowhere, as in tests).
  explicit DevdaxReservations(std::string path = "");

  // At start: the reservations the last run kept, less those whose process
  // has gone. A missing file is none; an unreadable line is skipped.
  Status Load();
  // Regions one uid may keep reserved for its processes at once (each
  // claim reads /proc for that uid's entries; Claim's cost is bounded by it).
  static constexpr size_t kPerUid = 16;

  // Whether `peer`'s process may have `region`, which `mapping` (the new
  // pool's) now maps: kBusy, saying who holds it, when the daemon still maps
  // an overlapping region or another live process made one; kLimit when its
  // uid keeps kPerUid regions for processes that still run. On success the
  // region is `peer`'s: its process's, when the daemon knows which
  // (peer.start_time, read at accept, and that process still runs), else
  // kept only while `mapping` lives.
  Status Claim(const Region& region, const server::Peer& peer, std::weak_ptr<const void> mapping);
  // Reservations kept (status, tests).
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Region region;
    uid_t uid = 0;
    pid_t pid = 0;
    uint64_t start = 0;                 // ProcessStartTime(pid) when it claimed
    std::weak_ptr<const void> mapping;  // the daemon's (none after a restart)
  };
  bool OwnerRuns(const Entry& e) const;
  void Save() const;

  std::string path_;
  std::string boot_id_;  // this boot's, read once: it cannot change while the daemon runs
  std::vector<Entry> entries_;
};

}  // namespace cxltier::service
