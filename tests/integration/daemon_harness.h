// Runs a real cxltierd in a child process for integration tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cxltier/client.h"
#include "fork_alone.h"

namespace cxltier::testing {

class DaemonProcess {
 public:
  // `extra_toml` is appended to a config with both tiers on node 0 (or the
  // [tiers] keys `tiers`); `daemon_keys` go into its [daemon] table (tick_ms
  // 20 unless they name it).
  explicit DaemonProcess(const std::string& extra_toml = "", const std::string& dir = "",
                         const std::string& daemon_keys = "",
                         const std::string& tiers = "fast_nodes = [0]\nslow_nodes = [0]\n") {
    dir_ =
        dir.empty()
            ? std::filesystem::temp_directory_path() /
                  ("cxltierd-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++))
            : std::filesystem::path(dir);
    std::filesystem::create_directories(dir_);
    socket_ = (dir_ / "d.sock").string();
    config_ = (dir_ / "cxltierd.toml").string();
    std::ofstream(config_) << "[daemon]\nsocket = \"" << socket_ << "\"\nstate_dir = \""
                           << (dir_ / "state").string() << "\"\nlog_level = \"info\"\n"
                           << (daemon_keys.find("tick_ms") == std::string::npos ? "tick_ms = 20\n"
                                                                                : "")
                           << daemon_keys << "\n[tiers]\n"
                           << tiers << "[metrics]\nlisten = \"127.0.0.1:0\"\n"
                           << extra_toml;
    Start();
  }
  ~DaemonProcess() {
    Stop(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void Start() {
    ::unlink(socket_.c_str());
    log_ = (dir_ / ("daemon-" + std::to_string(starts_++) + ".log")).string();
    // A raw fork is safe here with other threads running: the child only
    // opens, dup2s and execs (no allocation; see fork_alone.h).
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(DaemonPath(), "cxltierd", "--config", config_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait until the socket accepts (up to 60 s: a loaded machine may be slow to
    // start it), or the daemon exits (pid_ is then -1: Alive() is false).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!Connectable() && std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Sends `sig` and waits; returns the exit status (or -signal).
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }

  // The daemon binary: $CXLTIERD (a test binary copied into a QEMU guest),
  // else the build's.
  static const char* DaemonPath() {
    const char* env = getenv("CXLTIERD");
    return env && *env ? env : CXLTIERD_PATH;
  }
  const std::string& config_path() const { return config_; }

  bool Alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::path dir() const { return dir_; }

  bool Connectable() const {
    const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, socket_.c_str());
    const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(s);
    return ok;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string socket_, config_, log_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

// Tests wait for events, never for a fixed time: the machine may be shared by
// parallel tests and sanitizer builds. Waits return early; their bound only
// turns a daemon that never gets there into a failure instead of a hang.
inline constexpr auto kEventBound = std::chrono::seconds(60);

// Polls `done` every 10 ms until it holds or `bound` passes; returns its last value.
inline bool WaitFor(const std::function<bool()>& done,
                    std::chrono::milliseconds bound = kEventBound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Waits until the daemon has completed `n` more ticks (it publishes its tick
// count in the client's segment).
inline void WaitTicks(const Client& c, uint64_t n) {
  const uint64_t start = c.daemon_ticks();
  EXPECT_TRUE(WaitFor([&] { return c.daemon_ticks() >= start + n; }))
      << "the daemon did not tick " << n << " times in 60 s";
}

}  // namespace cxltier::testing
