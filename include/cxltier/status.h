// Status: the one error type of cxltier. A call that can fail returns a Status
// (or a Result<T>, a value or a Status): ok, or an error code and a readable
// message. The code is the wire protocol's: an error the daemon answers with
// is a Status on both sides of the socket (wire::Error is this type), so no
// call site maps messages to codes. Pure: the engine may include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace cxltier {
namespace wire {

// The codes of the wire protocol's Error message (docs/protocol.md).
enum class ErrorCode : uint32_t {
  kOk = 0,           // not an error: the code of a Status that is ok; never sent
  kBadFrame = 1,     // bad magic or unparseable header
  kBadVersion = 2,   // protocol version not spoken here
  kUnknownType = 3,  // message type not known
  kTooLarge = 4,     // payload over the configured limit
  kBadPayload = 5,   // payload (or configuration) does not match its layout
  kNotReady = 6,     // hello (or a pool) needed first
  kBadPool = 7,      // pool registration refused (fd, size, range)
  kLimit = 8,        // a configured limit was reached
  kBadSlot = 9,      // slot or block index out of range
  kDenied = 10,      // not allowed for this peer
  kInternal = 11,    // the daemon failed; the request may be retried
  kGeometry = 12,    // model geometry invalid or incompatible
  kNoLease = 13,     // copy mode: a lease released that is not held, a block with no place
  kBusy = 14,        // the write lease is held, no lease entry is free, or a recording runs
};

// Name of an error code, for messages and logs ("bad-pool", ...).
const char* ErrorName(ErrorCode code);

}  // namespace wire

struct Status {
  wire::ErrorCode code = wire::ErrorCode::kOk;  // kOk exactly when ok()
  std::string message;                          // empty when ok

  static Status Ok() { return Status{}; }
  // A failure: kOk is not one, so it becomes kInternal.
  static Status Fail(wire::ErrorCode c, std::string m) {
    return Status{c == wire::ErrorCode::kOk ? wire::ErrorCode::kInternal : c, std::move(m)};
  }
  // The daemon's own failure, or the system's under it (kInternal): a socket
  // that cannot listen, a file that cannot be written.
  static Status Internal(std::string m) { return Fail(wire::ErrorCode::kInternal, std::move(m)); }
  bool ok() const { return code == wire::ErrorCode::kOk; }
  // The same failure with `context` before its message ("state segment: ...").
  Status Context(const std::string& context) const {
    return ok() ? *this : Status{code, context + message};
  }
};

// A value, or the Status of why there is none.
template <typename T>
class Result {
 public:
  // A value, or anything a T can be made of (a unique_ptr to a derived class).
  template <typename U = T, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                                        !std::is_same_v<std::decay_t<U>, Result>>>
  Result(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT: a value converts
  // REQUIRES: !status.ok().
  Result(Status status) : status_(std::move(status)) {  // NOLINT: a failure converts
    if (status_.ok()) status_ = Status::Fail(wire::ErrorCode::kInternal, "no value");
  }
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace cxltier
