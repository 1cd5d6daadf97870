// The Prometheus endpoint: a small HTTP/1.1 server (Boost.Beast) on the I/O
// thread that answers GET /metrics with the text exposition format, one
// request per connection. Loopback by default; off when not configured.
#pragma once

#include <utility>  // Boost 1.74 Asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <functional>
#include <string>

#include "cxltier/status.h"

namespace cxltier::server {

class MetricsServer {
 public:
  // `render` builds the exposition text; it runs on the I/O thread.
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsServer();

  // "127.0.0.1:9464", "[::1]:9464" or "localhost:0" (0: any free port).
  Status Listen(const std::string& address);
  // The address actually bound ("127.0.0.1:40123").
  std::string bound() const { return bound_; }
  void Stop();

 private:
  void Accept();
  boost::asio::io_context& io_;
  std::function<std::string()> render_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string bound_;
};

// Splits "host:port" / "[v6]:port". Returns false on a malformed address.
bool ParseHostPort(const std::string& address, std::string* host, uint16_t* port);

}  // namespace cxltier::server
