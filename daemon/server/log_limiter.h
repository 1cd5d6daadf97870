// Lines about clients, at most `burst` per `window` for each key (a
// connection, or one key for a whole server); the rest are counted, and the
// count is handed back once the window is over, for one "suppressed" line. So
// no client can flood the journal, which would rate-limit away everyone
// else's lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>

namespace cxltier::server {

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

}  // namespace cxltier::server
