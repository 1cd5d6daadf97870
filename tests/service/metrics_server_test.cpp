// The Prometheus endpoint's defences (server/http.h): any local user can
// connect to it, so it keeps at most kMaxSessions connections open.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/http.h"

namespace cxltier::server {
namespace {

int ConnectTcp(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  if (inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The server closed its side: end of file (or an error) is readable.
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Idle connections (no request sent) used to be kept 10 s each, with no
// limit: enough of them took every descriptor the daemon had. Here a
// request may take 10 minutes, so only the cap closes any: of 100 idle
// connections the 84 oldest are closed and the 16 newest kept, and a
// scrape after them is answered (closing one more).
TEST(MetricsServer, AtMostSixteenConnectionsTheOldestMakeRoom) {
  boost::asio::io_context io;
  MetricsServer m(
      io, [] { return std::string("cxltier_test 1\n"); }, std::chrono::minutes(10));
  ASSERT_TRUE(m.Listen("127.0.0.1:0").ok());
  auto guard = boost::asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  constexpr size_t kIdle = 100;
  const size_t kept = MetricsServer::kMaxSessions;
  std::vector<int> idle;
  for (size_t i = 0; i < kIdle; ++i) {
    idle.push_back(ConnectTcp(m.bound()));
    ASSERT_GE(idle.back(), 0);
  }
  auto closed = [&] {
    size_t n = 0;
    for (int fd : idle) n += ClosedByServer(fd);
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (closed() < kIdle - kept && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(closed(), kIdle - kept);
  for (size_t i = 0; i < kIdle; ++i) {
    EXPECT_EQ(ClosedByServer(idle[i]), i < kIdle - kept) << "connection " << i;
  }
  const int fd = ConnectTcp(m.bound());
  ASSERT_GE(fd, 0);
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(fd, get.data(), get.size()), static_cast<ssize_t>(get.size()));
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK", 0), 0u) << answer;
  EXPECT_NE(answer.find("cxltier_test 1"), std::string::npos) << answer;
  EXPECT_TRUE(ClosedByServer(idle[kIdle - kept]));  // the oldest of those kept made room
  guard.reset();
  m.Stop();
  io.stop();
  runner.join();
  EXPECT_EQ(m.sessions_closed(), kIdle - kept + 1);
  for (int f : idle) close(f);
}

}  // namespace
}  // namespace cxltier::server
