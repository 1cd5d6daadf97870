#include "service/devdax_reservations.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cxltier::service {

namespace {
// This boot's id: a file kept across a reboot names processes of another.
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}
}  // namespace

DevdaxReservations::DevdaxReservations(std::string path)
    : path_(std::move(path)), boot_id_(path_.empty() ? std::string() : BootId()) {}

bool DevdaxReservations::OwnerRuns(const Entry& e) const {
  if (e.start == 0) return false;  // not known: kept only while mapped
  const std::optional<uint64_t> start = server::ProcessStartTime(e.pid);
  return start && *start == e.start;
}

Status DevdaxReservations::Load() {
  entries_.clear();
  if (path_.empty()) return Status::Ok();
  std::ifstream in(path_);
  if (!in) return Status::Ok();
  std::string line;
  // First line: the boot the pids and start times are of.
  if (boot_id_.empty() || !std::getline(in, line) || line != "boot " + boot_id_) {
    Save();
    return Status::Ok();
  }
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Entry e;
    uint64_t uid = 0, pid = 0;
    if (!(fields >> e.region.device >> e.region.begin >> e.region.end >> uid >> pid >> e.start) ||
        e.region.begin >= e.region.end || pid == 0 || pid > INT32_MAX) {
      continue;
    }
    e.uid = static_cast<uid_t>(uid);
    e.pid = static_cast<pid_t>(pid);
    if (OwnerRuns(e)) entries_.push_back(e);
  }
  if (!entries_.empty()) {
    spdlog::info("{} device-DAX region(s) still reserved for the processes that made them",
                 entries_.size());
  }
  Save();
  return Status::Ok();
}

Status DevdaxReservations::Claim(const Region& region, const server::Peer& peer,
                                 std::weak_ptr<const void> mapping) {
  // The process that connected, if it is still the one with that pid: a
  // connection handed on by a process that exited, whose pid was reused,
  // is no one's process.
  const bool known = peer.start_time != 0 && server::ProcessStartTime(peer.pid) == peer.start_time;
  // Entries that hold nothing any more go: no mapping, no process. Looked at
  // only where they could matter (overlapping, or of this uid: at most
  // kPerUid live ones), so a claim's cost does not grow with other uids'.
  std::erase_if(entries_, [&](const Entry& e) {
    return (e.region.Overlaps(region) || e.uid == peer.uid) && e.mapping.expired() && !OwnerRuns(e);
  });
  for (const Entry& e : entries_) {
    if (!e.region.Overlaps(region)) continue;
    if (!e.mapping.expired()) {
      return Status::Fail(
          wire::ErrorCode::kBusy,
          fmt::format("bytes {} to {} of this device-DAX device are a tier pool of a connection "
                      "of this daemon (or its blocks are being released, or a copy is running): "
                      "two owners would hand out the same places; try again, or give another "
                      "offset",
                      e.region.begin, e.region.end));
    }
    const bool same_process = known && e.pid == peer.pid && e.start == peer.start_time;
    if (!same_process) {
      return Status::Fail(
          wire::ErrorCode::kBusy,
          fmt::format("bytes {} to {} of this device-DAX device are reserved for pid {} (uid {}), "
                      "which made a tier pool there and may still read it; only that process "
                      "may take them again until it exits: give another offset",
                      e.region.begin, e.region.end, e.pid, e.uid));
    }
  }
  // The claimer's own reservations this one covers are replaced by it; the
  // parts of larger ones it does not cover stay reserved.
  const auto covered = [&](const Entry& e) {
    return e.region.device == region.device && region.begin <= e.region.begin &&
           e.region.end <= region.end;
  };
  const size_t mine =
      static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
        return e.uid == peer.uid && !covered(e);
      }));
  if (mine >= kPerUid) {
    return Status::Fail(wire::ErrorCode::kLimit,
                        fmt::format("uid {} keeps {} device-DAX regions reserved for its processes "
                                    "(at most {}): end those processes or their pools first",
                                    peer.uid, mine, kPerUid));
  }
  std::erase_if(entries_, covered);
  entries_.push_back(
      Entry{region, peer.uid, peer.pid, known ? peer.start_time : 0, std::move(mapping)});
  Save();
  return Status::Ok();
}

void DevdaxReservations::Save() const {
  if (path_.empty()) return;
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "boot " << boot_id_ << '\n';
    for (const Entry& e : entries_) {
      out << e.region.device << ' ' << e.region.begin << ' ' << e.region.end << ' ' << e.uid << ' '
          << e.pid << ' ' << e.start << '\n';
    }
    if (!out) {
      spdlog::warn("{}: cannot write the device-DAX reservations; a restart will not know them",
                   tmp);
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) spdlog::warn("{}: {}", path_, ec.message());
}

}  // namespace cxltier::service
