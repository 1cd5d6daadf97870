// Lines about clients, at most `burst` per `window` for each key (a
// connection, or one key for a whole server); the rest are counted, and the
// count is handed back once the window is over, for one "suppressed" line. So
// no client can flood the journal, which would rate-limit away everyone
// else's lines.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cxltier::server {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogLimiter(uint32_t burst, Clock::duration window) : burst_(burst), window_(window) {}

  struct Verdict {
    bool log = false;         // the caller may log its line now
    uint64_t suppressed = 0;  // held back in `key`'s window that just ended: log that first
    Clock::duration ended{};  // how long that window was
  };
  Verdict Allow(uint64_t key, Clock::time_point now) {
    Window& w = windows_[key];
    Verdict v;
    if (w.logged == 0 || now - w.start >= window_) {
      v.suppressed = w.held;
      v.ended = now - w.start;
      w = Window{now, 0, 0};
    }
    if (w.logged < burst_) {
      ++w.logged;
      ++logged_;
      v.log = true;
    } else {
      ++w.held;
      ++suppressed_total_;
    }
    return v;
  }
  // The count still held back for `key` (it is gone); forgets it.
  uint64_t Forget(uint64_t key) {
    auto it = windows_.find(key);
    if (it == windows_.end()) return 0;
    const uint64_t held = it->second.held;
    windows_.erase(it);
    return held;
  }
  // The keys whose window is over at `now`.
  std::vector<uint64_t> Over(Clock::time_point now) const {
    std::vector<uint64_t> over;
    for (const auto& [key, w] : windows_) {
      if (now - w.start >= window_) over.push_back(key);
    }
    return over;
  }
  // Forgets `key`'s window: the count it held back and how long it was open.
  std::pair<uint64_t, Clock::duration> Close(uint64_t key, Clock::time_point now) {
    auto it = windows_.find(key);
    if (it == windows_.end()) return {0, {}};
    const std::pair<uint64_t, Clock::duration> r{it->second.held, now - it->second.start};
    windows_.erase(it);
    return r;
  }
  size_t keys() const { return windows_.size(); }
  Clock::duration window() const { return window_; }
  uint64_t logged() const { return logged_; }
  uint64_t suppressed() const { return suppressed_total_; }

 private:
  struct Window {
    Clock::time_point start;
    uint32_t logged = 0;
    uint64_t held = 0;
  };
  uint32_t burst_;
  Clock::duration window_;
  std::unordered_map<uint64_t, Window> windows_;
  uint64_t logged_ = 0;
  uint64_t suppressed_total_ = 0;
};

// Lines about clients, limited per uid across all of its connections, since a
// uid can open as many connections as it likes: at most `burst` lines of one
// uid per `window` (its hello and left lines included), the rest counted and
// summed up in one line per window, at the uid's next line or by Sweep once
// its window is over. So one uid costs the journal at most burst + 1 lines
// per window, however it churns connections.
class PeerLog {
 public:
  using Clock = LogLimiter::Clock;
  using Sink = std::function<void(LogLevel, const std::string&)>;
  PeerLog(uint32_t burst, Clock::duration window) : limit_(burst, window) {}

  void set_sink(Sink sink) { sink_ = std::move(sink); }

  // A line about a client of `uid`; `what` names the client (pid, uid).
  void Line(uid_t uid, LogLevel level, const std::string& what, Clock::time_point now) {
    const LogLimiter::Verdict v = limit_.Allow(uid, now);
    if (v.suppressed) SumUp(uid, v.suppressed, v.ended);
    if (v.log) Emit(level, what);
    MaybeSweep(now);
  }
  void Line(uid_t uid, LogLevel level, const std::string& what) {
    Line(uid, level, what, Clock::now());
  }

  // Sweep, at most ten times a window (cheap to call every tick).
  void MaybeSweep(Clock::time_point now) {
    if (now >= next_sweep_) Sweep(now);
  }
  // Sums up the windows that are over with lines held back, and forgets the
  // quiet ones (so the table holds only uids heard from in the last window).
  void Sweep(Clock::time_point now) {
    next_sweep_ = now + limit_.window() / 10;
    for (const uid_t uid : limit_.Over(now)) {
      const auto [held, ended] = limit_.Close(uid, now);
      if (held) SumUp(uid, held, ended);
    }
  }

  Clock::duration window() const { return limit_.window(); }
  uint64_t logged() const { return limit_.logged(); }
  uint64_t suppressed() const { return limit_.suppressed(); }
  // Uids with a window open.
  size_t uids() const { return limit_.keys(); }

 private:
  void Emit(LogLevel level, const std::string& line) const {
    if (sink_) sink_(level, line);
  }
  void SumUp(uid_t uid, uint64_t held, Clock::duration ended) const {
    Emit(LogLevel::kWarn,
         "uid " + std::to_string(uid) + ": " + std::to_string(held) +
             " more lines about its clients were suppressed in the last " +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(ended).count()) +
             " s");
  }

  LogLimiter limit_;
  Sink sink_;
  Clock::time_point next_sweep_{};
};

}  // namespace cxltier::server
