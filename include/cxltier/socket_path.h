// Where cxltierd listens unless told otherwise: one definition for the daemon,
// the library's users and the tools (header-only: nothing to link).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace cxltier {

// The system daemon's socket: cxltierd.socket listens here, and so does a
// daemon started by root without --socket or [daemon] socket.
inline constexpr char kDefaultSocketPath[] = "/run/cxltierd/cxltierd.sock";

// The socket's name inside a runtime directory ($XDG_RUNTIME_DIR, or the
// RUNTIME_DIRECTORY systemd gives the service).
inline constexpr char kSocketFileName[] = "cxltierd.sock";

// Where a daemon run by an ordinary user listens: $XDG_RUNTIME_DIR/cxltierd.sock,
// or /tmp/cxltierd-<uid>.sock without a runtime directory.
inline std::string UserSocketPath() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime && *runtime) return std::string(runtime) + "/" + kSocketFileName;
  return "/tmp/cxltierd-" + std::to_string(getuid()) + ".sock";
}

// Where the caller's daemon listens by default: kDefaultSocketPath for root,
// UserSocketPath() for anyone else.
inline std::string DefaultSocketPath() {
  return geteuid() == 0 ? std::string(kDefaultSocketPath) : UserSocketPath();
}

}  // namespace cxltier
