#include "server/http.h"

#include <algorithm>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <memory>

namespace cxltier::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

bool ParseHostPort(const std::string& address, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return false;
    }
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) return false;
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const unsigned long v = std::stoul(p);
  if (v > 65535) return false;
  *host = h;
  *port = static_cast<uint16_t>(v);
  return true;
}

// One connection: read a request, answer it, close.
class MetricsServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const std::function<std::string()>& render)
      : stream_(std::move(socket)), render_(render) {}

  // A slow or silent peer is dropped: a scrape sends its request at once.
  void Start(std::chrono::seconds timeout) {
    stream_.expires_after(timeout);
    parser_.body_limit(64 * 1024);
    parser_.header_limit(16 * 1024);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }
  // Its request was read: it is being answered, and is never closed early.
  bool answering() const { return answering_; }
  // Makes room for a newer connection: its handlers end with an error.
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  void Answer() {
    answering_ = true;
    const auto& req = parser_.get();
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(req.version());
    res->keep_alive(false);
    res->set(http::field::server, "cxltierd");
    const std::string target(req.target());
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res->result(http::status::method_not_allowed);
      res->set(http::field::allow, "GET, HEAD");
      res->set(http::field::content_type, "text/plain");
      res->body() = "only GET\n";
    } else if (target != "/metrics" && target.rfind("/metrics?", 0) != 0) {
      res->result(http::status::not_found);
      res->set(http::field::content_type, "text/plain");
      res->body() = "cxltierd serves /metrics\n";
    } else {
      res->result(http::status::ok);
      res->set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      if (req.method() == http::verb::get) res->body() = render_();
    }
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::empty_body> parser_;
  std::function<std::string()> render_;
  bool answering_ = false;
};

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render,
                             std::chrono::seconds request_timeout)
    : io_(io),
      render_(std::move(render)),
      request_timeout_(request_timeout),
      acceptor_(io),
      backoff_timer_(io) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Listen(const std::string& address) {
  std::string host;
  uint16_t port = 0;
  if (!ParseHostPort(address, &host, &port)) {
    return Status::Internal("metrics address '" + address + "' is not host:port");
  }
  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  const auto results =
      resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    return Status::Internal("metrics address '" + address + "': " + ec.message());
  const tcp::endpoint ep = results.begin()->endpoint();
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Internal("metrics on " + address + ": " + ec.message());
  const tcp::endpoint local = acceptor_.local_endpoint(ec);
  bound_ = (local.address().is_v6() ? "[" + local.address().to_string() + "]"
                                    : local.address().to_string()) +
           ":" + std::to_string(local.port());
  Accept();
  return Status::Ok();
}

void MetricsServer::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of file descriptors (or another failure that an immediate retry
      // would only repeat, spinning the I/O thread): wait, doubling up to 1 s.
      backoff_ = backoff_.count() ? std::min(backoff_ * 2, kMaxBackoff) : kFirstBackoff;
      backoff_timer_.expires_after(backoff_);
      backoff_timer_.async_wait([this](const boost::system::error_code& e) {
        if (e != asio::error::operation_aborted && acceptor_.is_open()) Accept();
      });
      return;
    }
    backoff_ = {};
    Admit(std::move(socket));
    Accept();
  });
}

void MetricsServer::Admit(tcp::socket socket) {
  std::erase_if(sessions_, [](const std::weak_ptr<Session>& s) { return s.expired(); });
  // At most kMaxSessions waiting for their request: the oldest of them,
  // which has had the longest to send it, makes room. A scrape sends its
  // request with its connection and is answered in milliseconds (one being
  // answered is never closed), so idle connections can neither hold the
  // daemon's descriptors or memory nor keep a scraper out.
  size_t waiting = 0;
  auto oldest_waiting = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->lock()->answering()) continue;
    if (waiting++ == 0) oldest_waiting = it;
  }
  if (waiting >= kMaxSessions) {
    oldest_waiting->lock()->Close();
    sessions_.erase(oldest_waiting);
    ++sessions_closed_;
  }
  auto session = std::make_shared<Session>(std::move(socket), render_);
  sessions_.push_back(session);
  session->Start(request_timeout_);
}

void MetricsServer::Stop() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  backoff_timer_.cancel();
}

}  // namespace cxltier::server
