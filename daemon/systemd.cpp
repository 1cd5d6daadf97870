#include "systemd.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <memory>

namespace cxltier::systemd {

Result<int> ListenFd() {
  const int n = sd_listen_fds(1);  // 1: unset LISTEN_* so children do not inherit them
  if (n <= 0) return -1;
  if (n > 1) {
    return Status::Fail(wire::ErrorCode::kBadPayload,
                        "systemd passed " + std::to_string(n) + " sockets; cxltierd takes one");
  }
  const int fd = SD_LISTEN_FDS_START;
  if (sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) <= 0) {
    return Status::Fail(wire::ErrorCode::kBadPayload,
                        "the socket systemd passed is not a listening Unix stream socket");
  }
  return fd;
}

bool LoggingToJournal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (!js || !*js) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  return fstat(2, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

namespace {

// "<3>" for errors ... "<7>" for debug: the journal's syslog priorities.
class PriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr const char* kPrefix[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", "<6>"};
    const char* p = kPrefix[static_cast<int>(msg.level)];
    dest.append(p, p + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityFlag>();
  }
};

}  // namespace

void UseJournalLogFormat() {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<PriorityFlag>('*').set_pattern("%*%v");
  spdlog::set_formatter(std::move(f));
}

Notifier::Notifier(boost::asio::io_context& io) : timer_(io) {
  enabled_ = std::getenv("NOTIFY_SOCKET") != nullptr;
  uint64_t usec = 0;
  if (enabled_ && sd_watchdog_enabled(0, &usec) > 0) watchdog_ = std::chrono::microseconds(usec);
}

void Notifier::Ready(std::function<std::string()> status) {
  status_ = std::move(status);
  if (!enabled_) return;
  sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%lu", status_().c_str(),
             static_cast<unsigned long>(getpid()));
  if (watchdog_.count()) {
    spdlog::info("systemd watchdog: pinging every {} ms", watchdog_.count() / 2000);
  }
  next_status_ = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  Tick();
}

// Pings come from the I/O thread's timer: a stuck event loop stops them and
// systemd restarts the daemon.
void Notifier::Tick() {
  if (stopping_) return;
  if (watchdog_.count()) sd_notify(0, "WATCHDOG=1");
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_status_) {
    sd_notifyf(0, "STATUS=%s", status_().c_str());
    next_status_ = now + std::chrono::seconds(5);
  }
  const auto period = watchdog_.count() ? std::min<std::chrono::microseconds>(
                                              watchdog_ / 2, std::chrono::seconds(5))
                                        : std::chrono::microseconds(std::chrono::seconds(5));
  timer_.expires_after(period);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void Notifier::Reloading() {
  if (!enabled_) return;
  // RELOADING=1 wants MONOTONIC_USEC since systemd 253; older ones ignore it.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
             static_cast<unsigned long long>(ts.tv_sec) * 1000000ull + ts.tv_nsec / 1000);
}

void Notifier::ReloadDone() {
  if (!enabled_) return;
  sd_notifyf(0, "READY=1\nSTATUS=%s", status_ ? status_().c_str() : "running");
}

void Notifier::Stopping() {
  stopping_ = true;
  timer_.cancel();
  if (!enabled_) return;
  sd_notify(0, "STOPPING=1\nSTATUS=stopping: saving block states");
}

}  // namespace cxltier::systemd
