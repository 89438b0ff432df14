// status.h: the error type of every internal DYAD path.
//
// A Status is a dyad_rc_t plus a message that says what failed and why
// ("fetch 'a/b.dat' from rank 3: connection reset"). Result<T> is a value or
// a Status. errno is mapped to a code in exactly one place (StatusFromErrno).
// Both types are plain values, safe to copy between threads.
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <utility>

#include "dyad/common/dyad_rc.h"

namespace dyad {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(dyad_rc_t code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }

  bool ok() const { return code_ == DYAD_RC_OK; }
  dyad_rc_t code() const { return code_; }
  const std::string& message() const { return message_; }

  // "DYAD_RC_TIMEOUT: consume 'x': not published within 5 s"
  std::string ToString() const;

  // Prefixes the message with context, keeping the code and cause.
  Status Annotate(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_).WithCause(cause_);
  }

  // What lies behind the code when callers decide on it (e.g. a wait that
  // timed out because its store was unreachable: code DYAD_RC_TIMEOUT,
  // cause DYAD_RC_CONNLOST). DYAD_RC_OK when there is nothing more to say.
  dyad_rc_t cause() const { return cause_; }
  Status WithCause(dyad_rc_t cause) const {
    Status s = *this;
    s.cause_ = cause;
    return s;
  }

 private:
  dyad_rc_t code_ = DYAD_RC_OK;
  dyad_rc_t cause_ = DYAD_RC_OK;
  std::string message_;
};

// A status code that came from another process (a reply on the wire): only
// values this build defines become themselves; anything else is
// DYAD_RC_BADRPC, so a peer cannot make us hold an out-of-range enum value.
dyad_rc_t RcFromWire(int32_t code);

// Builds a Status from an errno value: `what` names the failed operation.
Status StatusFromErrno(int err, const std::string& what, dyad_rc_t code = DYAD_RC_SYSFAIL);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  Result(dyad_rc_t code, std::string msg) : status_(code, std::move(msg)) {}

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

#define DYAD_RETURN_IF_ERROR(expr) \
  do {                             \
    ::dyad::Status _st = (expr);   \
    if (!_st.ok()) return _st;     \
  } while (0)

}  // namespace dyad
