// Status and StatusOr: the error values of pstrain.
//
// Anything that users, files, the environment or peers can get wrong returns a
// Status (or StatusOr<T>) whose message says what was wrong and where: the file
// and byte offset, the key, the node, expected versus got. CHECK is kept for our
// own invariants only (see ../shared/style.md, habit 4).
//
// Both types are cheap to copy when ok (no allocation) and are [[nodiscard]].
#ifndef PSTRAIN_COMMON_STATUS_H_
#define PSTRAIN_COMMON_STATUS_H_

#include <glog/logging.h>

#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace pstrain {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // bad flag, config, message or file content
  kNotFound = 2,          // a file, key or node that does not exist
  kCorruption = 3,        // a file or message whose bytes are wrong
  kIOError = 4,           // the OS said no (open, read, write, bind)
  kDeadlineExceeded = 5,  // a wait ran past its deadline
  kUnavailable = 6,       // a peer is dead or unreachable
  kFailedPrecondition = 7,
  kOutOfRange = 8,
  kInternal = 9,
  kCancelled = 10,
  kUnimplemented = 11,
  kResourceExhausted = 12,  // memory (a device's or the host's) ran out
};

// Returns "InvalidArgument", "DeadlineExceeded", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) {
    return Status(StatusCode::kCorruption, std::move(msg));
  }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status DeadlineExceeded(std::string msg) {
    return Status(StatusCode::kDeadlineExceeded, std::move(msg));
  }
  static Status Unavailable(std::string msg) {
    return Status(StatusCode::kUnavailable, std::move(msg));
  }
  static Status FailedPrecondition(std::string msg) {
    return Status(StatusCode::kFailedPrecondition, std::move(msg));
  }
  static Status OutOfRange(std::string msg) {
    return Status(StatusCode::kOutOfRange, std::move(msg));
  }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  static Status Cancelled(std::string msg) {
    return Status(StatusCode::kCancelled, std::move(msg));
  }
  static Status Unimplemented(std::string msg) {
    return Status(StatusCode::kUnimplemented, std::move(msg));
  }
  static Status ResourceExhausted(std::string msg) {
    return Status(StatusCode::kResourceExhausted, std::move(msg));
  }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // The message without the code name; empty when ok.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <old message>"; ok stays ok.
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& other) const {
    return code() == other.code() && message() == other.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null when ok; immutable, so sharing is safe
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// A value or the Status that says why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    CHECK(!status_.ok()) << "StatusOr constructed from an ok Status without a value";
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    CHECK(ok()) << status_;
    return *value_;
  }
  const T& value() const& {
    CHECK(ok()) << status_;
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << status_;
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

// Builds a message from streamed parts: StrCat("key ", k, " expected ", n).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace pstrain

#define PSTRAIN_CONCAT_INNER_(a, b) a##b
#define PSTRAIN_CONCAT_(a, b) PSTRAIN_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::pstrain::Status pstrain_status_ = (expr);        \
    if (!pstrain_status_.ok()) return pstrain_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(PSTRAIN_CONCAT_(pstrain_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

// For tools and tests: dies with the status message if not ok.
#define CHECK_OK(expr)                              \
  do {                                              \
    ::pstrain::Status pstrain_status_ = (expr);     \
    CHECK(pstrain_status_.ok()) << pstrain_status_; \
  } while (0)

#endif  // PSTRAIN_COMMON_STATUS_H_
