// The Unix-socket server: accepts clients, frames and decodes their messages,
// hands them to a Handler on the I/O thread, and writes the answers back. The
// only code in the daemon that speaks the wire.
#pragma once

#include <sys/types.h>

#include <utility>  // Boost 1.74 Asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "cxltier/wire.h"
#include "unique_fd.h"

namespace cxltier::server {

// Who is on the other end, from SO_PEERCRED (never from a message).
struct Peer {
  uint64_t session_id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

template <typename T>
using Answer = std::variant<T, wire::Error>;

// Called on the I/O thread only.
class Handler {
 public:
  virtual ~Handler() = default;
  // A new connection; an error refuses it (the error is sent, then it closes).
  virtual std::optional<wire::Error> OnConnect(const Peer& peer) = 0;
  virtual void OnDisconnect(const Peer& peer) = 0;
  // *segment_fd: the state segment's fd to pass back (the handler keeps owning it).
  virtual Answer<wire::HelloOk> OnHello(const Peer& peer, const wire::Hello& m,
                                        int* segment_fd) = 0;
  virtual Answer<wire::RegisterPoolOk> OnRegisterPool(const Peer& peer, const wire::RegisterPool& m,
                                                      UniqueFd memfd) = 0;
  virtual Answer<wire::AdmitOk> OnAdmit(const Peer& peer, const wire::Admit& m) = 0;
  virtual Answer<wire::ReleaseOk> OnRelease(const Peer& peer, const wire::Release& m) = 0;
  virtual Answer<wire::ReportOk> OnReport(const Peer& peer, const wire::Report& m) = 0;
  virtual Answer<wire::QueryTiersOk> OnQueryTiers(const Peer& peer, const wire::QueryTiers& m) = 0;
  virtual Answer<wire::StatsOk> OnStats(const Peer& peer, const wire::Stats& m) = 0;
  virtual Answer<wire::AdminOk> OnAdmin(const Peer& peer, const wire::Admin& m) = 0;
};

struct ServerOptions {
  uint32_t max_message_bytes = wire::kDefaultMaxPayload;
  // Called with a one-line description of every protocol error a client caused.
  std::function<void(const Peer&, const std::string&)> on_protocol_error;
};

class Session;

class Server {
 public:
  Server(boost::asio::io_context& io, Handler& handler, ServerOptions options);
  ~Server();

  // Binds `path` (replacing a stale socket file) with file mode `mode`.
  // Returns an error message or "".
  std::string Listen(const std::string& path, unsigned mode);
  // Uses an already listening socket (systemd socket activation).
  std::string Adopt(int listen_fd);
  // Stops accepting and closes every session.
  void Stop();
  size_t sessions() const { return sessions_.size(); }

 private:
  friend class Session;
  void Accept();
  void Forget(Session* s);

  boost::asio::io_context& io_;
  Handler& handler_;
  ServerOptions options_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::set<std::shared_ptr<Session>> sessions_;
  uint64_t next_session_id_ = 1;
  std::string path_;
};

}  // namespace cxltier::server
