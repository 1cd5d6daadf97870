#include "service/devdax_reservations.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cxltier::service {

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: the fields
  // after it start past its last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return std::nullopt;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return std::nullopt;
  }
}

bool DevdaxReservations::OwnerRuns(const Entry& e) const {
  const std::optional<uint64_t> start = ProcessStartTime(e.pid);
  return start && *start == e.start;
}

Status DevdaxReservations::Load() {
  entries_.clear();
  if (path_.empty()) return Status::Ok();
  std::ifstream in(path_);
  if (!in) return Status::Ok();
  std::string line;
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
  const std::optional<uint64_t> start = ProcessStartTime(peer.pid);
  // Entries that no longer hold anything go first: their mapping is gone
  // and their process has exited.
  std::erase_if(entries_, [&](const Entry& e) { return e.mapping.expired() && !OwnerRuns(e); });
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
    const bool same_process = start && e.pid == peer.pid && e.start == *start;
    if (!same_process) {
      return Status::Fail(
          wire::ErrorCode::kBusy,
          fmt::format("bytes {} to {} of this device-DAX device are reserved for pid {} (uid {}), "
                      "which made a tier pool there and may still read it; only that process "
                      "may take them again until it exits: give another offset",
                      e.region.begin, e.region.end, e.pid, e.uid));
    }
  }
  // The claimer's own old reservations there are replaced by this one.
  std::erase_if(entries_, [&](const Entry& e) { return e.region.Overlaps(region); });
  entries_.push_back(Entry{region, peer.uid, peer.pid, start.value_or(0), std::move(mapping)});
  Save();
  return Status::Ok();
}

void DevdaxReservations::Save() const {
  if (path_.empty()) return;
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
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
