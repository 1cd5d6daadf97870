#include "server.h"

#include "cxltier/detail/fd_passing.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace cxltier::server {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

// One client connection. Reads with recvmsg so SCM_RIGHTS fds arrive with the
// bytes; frames are parsed from an input buffer; answers are queued.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, stream::socket socket, Peer peer)
      : server_(server), socket_(std::move(socket)), peer_(peer) {}

  const Peer& peer() const { return peer_; }

  void Start() {
    if (auto refusal = server_.handler_.OnConnect(peer_)) {
      connected_ = false;
      Send(*refusal, 0);
      close_after_write_ = true;
      return;
    }
    connected_ = true;
    ArmRead();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    if (connected_) server_.handler_.OnDisconnect(peer_);
    server_.Forget(this);
  }

 private:
  static constexpr size_t kMaxQueuedFds = 4;

  void ArmRead() {
    socket_.async_wait(
        stream::socket::wait_read,
        [self = shared_from_this()](const boost::system::error_code& ec) { self->OnReadable(ec); });
  }

  void OnReadable(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) return Close();
    uint8_t buf[64 * 1024];
    for (;;) {
      const ssize_t n = detail::RecvWithFds(socket_.native_handle(), buf, sizeof(buf), MSG_DONTWAIT,
                                            [this](int fd) {
                                              fds_.emplace_back(fd);
                                              // Stray fds beyond a few are closed.
                                              if (fds_.size() > kMaxQueuedFds) fds_.pop_front();
                                            });
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Close();
      }
      if (n == 0) return Close();
      in_.insert(in_.end(), buf, buf + n);
      if (static_cast<size_t>(n) < sizeof(buf)) break;
    }
    Process();
    if (!closed_ && !close_after_write_) ArmRead();
  }

  void ProtocolError(const std::string& what) {
    if (server_.options_.on_protocol_error) server_.options_.on_protocol_error(peer_, what);
  }

  void Process() {
    size_t pos = 0;
    while (!close_after_write_ && in_.size() - pos >= wire::kHeaderBytes) {
      const wire::Header h = *wire::DecodeHeader(std::span(in_).subspan(pos));
      if (auto err = wire::CheckHeader(h, server_.options_.max_message_bytes)) {
        ProtocolError(err->message);
        Send(*err, h.request_id);
        if (err->code != wire::ErrorCode::kUnknownType) {
          close_after_write_ = true;  // the stream cannot be trusted past this point
          break;
        }
        if (in_.size() - pos < wire::kHeaderBytes + h.payload_bytes) break;
        pos += wire::kHeaderBytes + h.payload_bytes;  // skip the unknown message whole
        continue;
      }
      if (in_.size() - pos < wire::kHeaderBytes + h.payload_bytes) break;
      Dispatch(h, std::span(in_).subspan(pos + wire::kHeaderBytes, h.payload_bytes));
      pos += wire::kHeaderBytes + h.payload_bytes;
    }
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(pos));
  }

  template <typename M, typename Fn>
  void Handle(const wire::Header& h, std::span<const uint8_t> payload, const char* name, Fn&& fn) {
    M m;
    std::string why;
    if (!wire::Decode(payload, &m, &why)) {
      const std::string text = std::string(name) + ": " + why;
      ProtocolError(text);
      return Send(wire::Error{wire::ErrorCode::kBadPayload, text}, h.request_id);
    }
    auto answer = fn(m);
    std::visit([&](const auto& a) { Send(a, h.request_id); }, answer);
  }

  void Dispatch(const wire::Header& h, std::span<const uint8_t> payload) {
    Handler& handler = server_.handler_;
    switch (h.type) {
      case wire::MsgType::kHello:
        return Handle<wire::Hello>(h, payload, "hello", [&](const wire::Hello& m) {
          int fd = -1;
          auto a = handler.OnHello(peer_, m, &fd);
          if (std::holds_alternative<wire::HelloOk>(a)) pending_fd_ = fd;
          return a;
        });
      case wire::MsgType::kRegisterPool:
        return Handle<wire::RegisterPool>(
            h, payload, "register-pool",
            [&](const wire::RegisterPool& m) -> Answer<wire::RegisterPoolOk> {
              UniqueFd fd;
              if (!fds_.empty()) {
                fd = std::move(fds_.front());
                fds_.pop_front();
              }
              if (m.kind == wire::PoolKind::kMemfd && !fd.valid()) {
                return wire::Error{wire::ErrorCode::kBadPool,
                                   "a memfd pool needs its fd passed with SCM_RIGHTS"};
              }
              return handler.OnRegisterPool(peer_, m, std::move(fd));
            });
      case wire::MsgType::kAdmit:
        return Handle<wire::Admit>(h, payload, "admit",
                                   [&](const wire::Admit& m) { return handler.OnAdmit(peer_, m); });
      case wire::MsgType::kRelease:
        return Handle<wire::Release>(h, payload, "release", [&](const wire::Release& m) {
          return handler.OnRelease(peer_, m);
        });
      case wire::MsgType::kReport:
        return Handle<wire::Report>(h, payload, "report", [&](const wire::Report& m) {
          return handler.OnReport(peer_, m);
        });
      case wire::MsgType::kQueryTiers:
        return Handle<wire::QueryTiers>(h, payload, "query-tiers", [&](const wire::QueryTiers& m) {
          return handler.OnQueryTiers(peer_, m);
        });
      case wire::MsgType::kStats:
        return Handle<wire::Stats>(h, payload, "stats",
                                   [&](const wire::Stats& m) { return handler.OnStats(peer_, m); });
      case wire::MsgType::kAdmin:
        return Handle<wire::Admin>(h, payload, "admin",
                                   [&](const wire::Admin& m) { return handler.OnAdmin(peer_, m); });
      default: {
        const std::string text = "message type " + std::to_string(static_cast<int>(h.type)) +
                                 " is a reply; clients may not send it";
        ProtocolError(text);
        return Send(wire::Error{wire::ErrorCode::kUnknownType, text}, h.request_id);
      }
    }
  }

  template <typename M>
  void Send(const M& m, uint32_t request_id) {
    Out out;
    wire::Encode(m, request_id, out.bytes);
    if constexpr (std::is_same_v<M, wire::HelloOk>) out.fd = std::exchange(pending_fd_, -1);
    out_.push_back(std::move(out));
    if (!writing_) WriteNext();
  }

  struct Out {
    std::vector<uint8_t> bytes;
    int fd = -1;  // sent with the first byte; not owned
    size_t sent = 0;
  };

  void WriteNext() {
    if (closed_) return;
    if (out_.empty()) {
      writing_ = false;
      if (close_after_write_) Close();
      return;
    }
    writing_ = true;
    socket_.async_wait(
        stream::socket::wait_write,
        [self = shared_from_this()](const boost::system::error_code& ec) { self->OnWritable(ec); });
  }

  void OnWritable(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) return Close();
    Out& o = out_.front();
    while (o.sent < o.bytes.size()) {
      const ssize_t n = detail::SendWithFd(socket_.native_handle(), o.bytes.data() + o.sent,
                                           o.bytes.size() - o.sent, o.sent == 0 ? o.fd : -1,
                                           MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return WriteNext();
        return Close();
      }
      o.sent += static_cast<size_t>(n);
    }
    out_.pop_front();
    WriteNext();
  }

  Server& server_;
  stream::socket socket_;
  Peer peer_;
  std::vector<uint8_t> in_;
  std::deque<UniqueFd> fds_;
  std::deque<Out> out_;
  int pending_fd_ = -1;
  bool writing_ = false;
  bool connected_ = false;
  bool closed_ = false;
  bool close_after_write_ = false;
};

Server::Server(asio::io_context& io, Handler& handler, ServerOptions options)
    : io_(io), handler_(handler), options_(std::move(options)), acceptor_(io) {}

Server::~Server() { Stop(); }

std::string Server::Listen(const std::string& path, unsigned mode) {
  boost::system::error_code ec;
  ::unlink(path.c_str());  // a stale socket from an earlier run
  acceptor_.open(stream(), ec);
  if (!ec) acceptor_.bind(stream::endpoint(path), ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return path + ": " + ec.message();
  if (::chmod(path.c_str(), mode) != 0) return path + ": chmod: " + std::strerror(errno);
  path_ = path;
  Accept();
  return {};
}

std::string Server::Adopt(int listen_fd) {
  boost::system::error_code ec;
  acceptor_.assign(stream(), listen_fd, ec);
  if (ec) return "adopting fd " + std::to_string(listen_fd) + ": " + ec.message();
  Accept();
  return {};
}

void Server::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, stream::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      Peer peer;
      peer.session_id = next_session_id_++;
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        peer.pid = cred.pid;
        peer.uid = cred.uid;
        peer.gid = cred.gid;
      }
      auto s = std::make_shared<Session>(*this, std::move(socket), peer);
      sessions_.insert(s);
      s->Start();
    }
    Accept();
  });
}

void Server::Forget(Session* s) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->get() == s) {
      // Keep the session alive until its handlers unwind.
      asio::post(io_, [keep = *it] {});
      sessions_.erase(it);
      return;
    }
  }
}

void Server::Stop() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
  auto all = sessions_;
  for (const auto& s : all) s->Close();
}

}  // namespace cxltier::server
