// errno's text after what failed, shared by the daemon's OS-facing parts and
// the Python module. Not part of the client API, and not for daemon/engine
// (which makes no system call, so has no errno to report).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "cxltier/status.h"

namespace cxltier::detail {

// "open /run/x: No such file or directory". Call it before anything else
// that may set errno.
inline std::string ErrnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

// The same as an internal failure (kInternal).
inline Status ErrnoStatus(const std::string& what) { return Status::Internal(ErrnoText(what)); }

}  // namespace cxltier::detail
