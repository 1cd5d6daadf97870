// cxltierd's systemd integration without PID 1: systemd-socket-activate
// passes the listening socket (sd_listen_fds), a datagram socket of ours
// plays systemd's notification socket (READY, STATUS, WATCHDOG, RELOADING,
// STOPPING), and JOURNAL_STREAM pointing at the log file switches the log to
// the journal's "<priority>" form.
#include <fcntl.h>
#include <gtest/gtest.h>
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
#include <string>
#include <thread>

#include "cxltier/client.h"
#include "fork_alone.h"
#include "models.h"

namespace cxltier {
namespace {

// Collects notification datagrams until one contains `want` or time runs out
// (60 s by default: a bound for a daemon that never sends it, not a deadline
// the daemon must meet on a loaded machine).
std::string WaitFor(int sock, const std::string& want, std::string* all, int ms = 60000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    char buf[4096];
    const ssize_t n = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      const std::string msg(buf, static_cast<size_t>(n));
      *all += msg + "\n--\n";
      if (msg.find(want) != std::string::npos) return msg;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

TEST(Systemd, SocketActivationNotifyWatchdogAndJournal) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("cxltier-systemd-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string notify_path = (dir / "notify").string();
  const std::string sock_path = (dir / "act.sock").string();
  const std::string log_path = (dir / "daemon.log").string();
  const std::string config = (dir / "c.toml").string();
  std::ofstream(config) << "[daemon]\nstate_dir = \"" << (dir / "state").string()
                        << "\"\ntick_ms = 20\n[tiers]\nfast_nodes = [0]\nslow_nodes = [0]\n"
                        << "[metrics]\nlisten = \"127.0.0.1:0\"\n";

  const int ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, notify_path.c_str());
  ASSERT_EQ(bind(ns, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);

  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  struct stat st {};
  ASSERT_EQ(fstat(log_fd, &st), 0);
  const std::string journal = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  const pid_t pid = testing::ForkAlone();
  if (pid == 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    const std::string e1 = "NOTIFY_SOCKET=" + notify_path, e2 = "JOURNAL_STREAM=" + journal;
    execl("/usr/bin/systemd-socket-activate", "systemd-socket-activate", "-l", sock_path.c_str(),
          "-E", e1.c_str(), "-E", "WATCHDOG_USEC=400000", "-E", e2.c_str(), CXLTIERD_PATH,
          "--config", config.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(log_fd);
  // systemd-socket-activate starts the daemon at the first connection; the
  // socket appears once it has started (up to 60 s).
  const auto connect_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status s;
  std::unique_ptr<Client> c;
  while (!c && std::chrono::steady_clock::now() < connect_by) {
    if (std::filesystem::exists(sock_path))
      c = Client::Connect({sock_path, kTiny4KiB, 8, "activated"}, &s);
    if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string all;
  const std::string ready = WaitFor(ns, "READY=1", &all);
  ASSERT_TRUE(c) << s.message;
  ASSERT_NE(ready, "") << all;
  EXPECT_NE(ready.find("STATUS="), std::string::npos) << ready;
  // The daemon keeps pinging the watchdog (at half its 400 ms period): wait
  // for three pings. Their rate is the scheduler's on a loaded machine, so it
  // is not asserted; each ping must come within 60 s.
  int pings = 0;
  while (pings < 3 && WaitFor(ns, "WATCHDOG=1", &all) != "") ++pings;
  EXPECT_GE(pings, 3) << all;
  // The client works through the activated socket.
  std::string text;
  EXPECT_TRUE(c->Stats("status", &text).ok());
  kill(pid, SIGHUP);
  EXPECT_NE(WaitFor(ns, "RELOADING=1", &all), "") << all;
  EXPECT_NE(WaitFor(ns, "READY=1", &all), "") << all;
  kill(pid, SIGTERM);
  EXPECT_NE(WaitFor(ns, "STOPPING=1", &all), "") << all;
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(log_path);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The journal form: priority prefixes, no timestamps of our own.
  EXPECT_NE(log.find("<6>listening on the socket systemd passed"), std::string::npos) << log;
  EXPECT_EQ(log.find("2026-"), std::string::npos) << log;
  close(ns);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cxltier
