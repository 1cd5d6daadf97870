// The daemon's side of `cxltierctl record`: start a recording, stop it and
// hand the trace back as a memfd (service/recorder.h says what is recorded).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <string.h>  // explicit_bzero
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "service/requests.h"

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

namespace {
// At most this many events per recording (and Recorder::kMaxBytes), split in
// shares per uid (service/recorder.h), and this long.
constexpr uint64_t kRecordMaxEvents = uint64_t{1} << 24;
constexpr uint64_t kRecordMaxSeconds = 24 * 3600;
}  // namespace

Result<wire::AdminOk> Requests::StartRecording(const std::string& arg) {
  if (d_.recorder.on()) {
    return Error{ErrorCode::kBusy, "a recording is already running; stop it first"};
  }
  const std::string_view a = arg;
  const size_t colon = a.find(':');
  const std::string_view secs = a.substr(0, colon);
  const std::string_view max = colon == std::string_view::npos ? "" : a.substr(colon + 1);
  uint64_t seconds = 0, max_events = kRecordMaxEvents;
  const auto parse = [](std::string_view v, uint64_t* out) {
    const auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
    return r.ec == std::errc() && r.ptr == v.data() + v.size();
  };
  if (!parse(secs, &seconds) || seconds == 0 || seconds > kRecordMaxSeconds ||
      (colon != std::string_view::npos &&
       (!parse(max, &max_events) || max_events == 0 || max_events > kRecordMaxEvents))) {
    return Error{ErrorCode::kBadPayload,
                 "record start needs SECONDS (1 to " + std::to_string(kRecordMaxSeconds) +
                     ") or SECONDS:MAX_EVENTS (1 to " + std::to_string(kRecordMaxEvents) +
                     "), got '" + arg + "'"};
  }
  Recorder::Secret secret;
  for (size_t got = 0; got < secret.size();) {
    // Never block the I/O thread: early in boot the pool may not be ready.
    const ssize_t n = getrandom(secret.data() + got, secret.size() - got, GRND_NONBLOCK);
    if (n < 0) {
      if (errno == EINTR) continue;
      explicit_bzero(secret.data(), secret.size());
      if (errno == EAGAIN) {
        return Error{ErrorCode::kNotReady,
                     "the kernel's random pool is not ready yet; try again shortly"};
      }
      return Error{ErrorCode::kInternal, std::string("getrandom: ") + std::strerror(errno)};
    }
    got += static_cast<size_t>(n);
  }
  const uint64_t ticks =
      (seconds * 1000 + d_.config.tick_ms - 1) / std::max<uint32_t>(d_.config.tick_ms, 1);
  d_.recorder.Start(d_.tick, ticks, max_events, secret);
  // Its replay starts with the policy's leader of now.
  if (d_.engine) {
    d_.recorder.Leader(d_.tick, d_.engine->policy().LeaderChanges(), d_.engine->policy().Leader());
  }
  explicit_bzero(secret.data(), secret.size());
  spdlog::info("recording for {} s ({} ticks, at most {} events)", seconds, ticks, max_events);
  return wire::AdminOk{"recording for " + std::to_string(seconds) + " s"};
}

Result<wire::AdminOk> Requests::StopRecording(server::UniqueFd* trace_fd) {
  d_.recorder.Stop(d_.tick);
  if (!d_.recorder.ready()) {
    return Error{ErrorCode::kNotReady, "no recording to stop; start one with record start"};
  }
  auto [trace, sum] = d_.recorder.Take();
  server::UniqueFd fd(memfd_create("cxltier-recording", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid())
    return Error{ErrorCode::kInternal, std::string("memfd_create: ") + std::strerror(errno)};
  {
    // A second description of the same memfd, for a stream to write through.
    std::ofstream out("/proc/self/fd/" + std::to_string(fd.get()), std::ios::binary);
    const Status st = sim::WriteBinary(trace, out);
    out.flush();
    if (!st.ok() || !out) {
      return Error{ErrorCode::kInternal,
                   "writing the recording: " + (st.ok() ? std::string("short write") : st.message)};
    }
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    return Error{ErrorCode::kInternal,
                 std::string("sealing the recording: ") + std::strerror(errno)};
  }
  const uint64_t block_bytes = d_.engine ? d_.engine->options().block_bytes : d_.config.block_bytes;
  nlohmann::json j = {
      {"start_tick", sum.start_tick},
      {"end_tick", sum.end_tick},
      {"ticks", sum.end_tick - sum.start_tick},
      {"tick_ms", d_.config.tick_ms},
      {"events", sum.events},
      {"keys", sum.keys},
      {"truncated", sum.truncated},
      {"touches", sum.touches},
      {"hits", sum.hits},
      {"hit_rate", sum.touches ? static_cast<double>(sum.hits) / sum.touches : 0.0},
      {"hints", sum.hints},
      {"groups", sum.groups},
      // The daemon's moves (cxltier-sim --moves recorded replays them), in
      // the trace only while it is exact: nothing lost to a uid's share.
      {"recorded_moves", sum.replay_exact},
      // cxltierctl's JSON names its exact replay command "replay_exact".
      {"exact", sum.replay_exact},
      {"plans", sum.plans},
      {"move_outcomes", sum.outcomes},
      {"moves_done", sum.outcomes_done},
      {"relocations", sum.relocations},
      {"leader_changes", sum.leader_changes},
      {"policy", d_.config.policy},
      {"persist", d_.config.persist},
      {"tier0_budget_bytes",
       d_.engine ? d_.engine->capacity_blocks() * block_bytes : d_.config.tier0_budget_bytes},
      // Tiers 1 .. n-2 on a host with more than two (the last holds the rest).
      {"lower_tier_budget_bytes",
       d_.engine ? d_.engine->options().lower_tier_budget_bytes : d_.LowerTierBudgets()},
      {"block_bytes", block_bytes},
      {"migrate_bytes_per_tick", block_bytes ? MigrateBytesPerTick(d_.config, block_bytes) : 0},
      {"hysteresis_ticks", d_.config.hysteresis_ticks},
      {"landing_percent",
       d_.engine ? d_.engine->options().landing_percent : d_.config.landing_percent},
      {"ghost_capacity", d_.config.ghost_capacity},
  };
  // Whose traffic it holds, and who lost events past their share (uid
  // numbers: only an admin records).
  nlohmann::json uids = nlohmann::json::object(), dropped = nlohmann::json::object();
  for (const auto& [uid, n] : sum.uids) {
    uids[std::to_string(uid)] = n.events;
    if (n.dropped) dropped[std::to_string(uid)] = n.dropped;
  }
  j["uids"] = std::move(uids);
  j["dropped"] = std::move(dropped);
  j["dropped_events"] = sum.dropped;
  spdlog::info(
      "recording stopped: {} ticks, {} events, {} blocks, {} records dropped past "
      "their uid's share",
      sum.end_tick - sum.start_tick, sum.events, sum.keys, sum.dropped);
  *trace_fd = std::move(fd);
  return wire::AdminOk{j.dump()};
}

}  // namespace cxltier::service
