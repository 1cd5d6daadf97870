// cxltierd under systemd: socket activation (sd_listen_fds), readiness,
// status, reload and stop notifications and the watchdog (sd_notify), and log
// lines the journal reads with their priority. Outside systemd every call
// here does nothing.
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "cxltier/status.h"

namespace cxltier::systemd {

// The listening socket systemd passed (exactly one), or -1 when it passed
// none; an error when it passed something cxltierd cannot use.
Result<int> ListenFd();

// True when stderr goes to the journal (JOURNAL_STREAM matches it).
bool LoggingToJournal();

// spdlog pattern for the journal: "<N>" priority prefixes, no timestamp.
void UseJournalLogFormat();

class Notifier {
 public:
  explicit Notifier(boost::asio::io_context& io);
  // READY=1 and the first STATUS; starts the watchdog pings if WatchdogSec= is
  // set. `status` is asked for a fresh one-line STATUS every few seconds.
  void Ready(std::function<std::string()> status);
  void Reloading();
  void ReloadDone();
  void Stopping();
  bool under_systemd() const { return enabled_; }

 private:
  void Tick();
  boost::asio::steady_timer timer_;
  std::function<std::string()> status_;
  std::chrono::microseconds watchdog_{0};
  std::chrono::steady_clock::time_point next_status_{};
  bool enabled_ = false;
  bool stopping_ = false;
};

}  // namespace cxltier::systemd
