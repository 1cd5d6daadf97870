// The Prometheus endpoint: a small HTTP/1.1 server (Boost.Beast) on the I/O
// thread that answers GET /metrics with the text exposition format, one
// request per connection. Loopback by default; off when not configured.
// Any local user can connect (TCP has no peer uid to limit by): at most
// kMaxSessions connections wait for their request at once (a new one closes
// the oldest of them; one being answered is never closed), each has
// kRequestTimeout (2 s) to send its request, and accept failures (out of
// file descriptors) back off instead of retrying at once.
#pragma once

#include <utility>  // Boost 1.74 Asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "cxltier/status.h"

namespace cxltier::server {

class MetricsServer {
 public:
  static constexpr size_t kMaxSessions = 16;
  static constexpr std::chrono::seconds kRequestTimeout{2};

  // `render` builds the exposition text; it runs on the I/O thread. A
  // connection has `request_timeout` to send its request.
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render,
                std::chrono::seconds request_timeout = kRequestTimeout);
  ~MetricsServer();

  // "127.0.0.1:9464", "[::1]:9464" or "localhost:0" (0: any free port).
  Status Listen(const std::string& address);
  // The address actually bound ("127.0.0.1:40123").
  std::string bound() const { return bound_; }
  void Stop();
  // Connections closed to make room for newer ones.
  uint64_t sessions_closed() const { return sessions_closed_; }

 private:
  class Session;
  static constexpr std::chrono::milliseconds kFirstBackoff{100};
  static constexpr std::chrono::milliseconds kMaxBackoff{1000};
  void Accept();
  void Admit(boost::asio::ip::tcp::socket socket);
  boost::asio::io_context& io_;
  std::function<std::string()> render_;
  std::chrono::seconds request_timeout_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer backoff_timer_;
  std::chrono::milliseconds backoff_{0};
  std::deque<std::weak_ptr<Session>> sessions_;  // oldest first
  uint64_t sessions_closed_ = 0;
  std::string bound_;
};

// Splits "host:port" / "[v6]:port". Returns false on a malformed address.
bool ParseHostPort(const std::string& address, std::string* host, uint16_t* port);

}  // namespace cxltier::server
