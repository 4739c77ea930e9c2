// Status and Result<T>: how Gossamer reports what the network, the disk or another machine can cause.
//
// Error policy (docs/errors.md): a failure that a peer, a file or the environment can cause is a value
// (Status / Result<T>, both [[nodiscard]]) carrying a code and a message that names the culprit and the
// fix. A caller's bug (wrong shape, use after close) throws ContractError through GOSSAMER_CHECK.
// Both types are plain values: copyable, movable, thread-compatible (not internally synchronized).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/check.h"

namespace gossamer {

// Error codes travel inside wire messages (ERROR frames), so the numbers are pinned.
enum class ErrorCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument = 1,   // a value supplied by a user or config is not acceptable
  kNotFound = 2,          // a file, key or peer does not exist
  kOutOfRange = 3,        // a value or size exceeds an allowed bound
  kDataLoss = 4,          // bytes are corrupt or truncated (checksum, short file)
  kMalformed = 5,         // bytes do not follow the format (bad magic, inconsistent fields)
  kVersionMismatch = 6,   // the format or protocol version is not one we speak
  kIoError = 7,           // the operating system refused a read or write
  kTimeout = 8,           // a deadline passed
  kPeerLost = 9,          // a peer went away
  kUnauthenticated = 10,  // credentials missing or wrong
  kAborted = 11,          // the operation was abandoned (round aborted, shutdown)
  kUnavailable = 12,      // try again later
  kResourceExhausted = 13,
  kInternal = 14,
};
static_assert(static_cast<int>(ErrorCode::kInternal) == 14, "ErrorCode values travel on the wire: never renumber");

std::string_view to_string(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "data_loss: checkpoint runs/x/ckpt.bin is truncated ..."
  std::string to_string() const;

  // Prefixes the message with context ("loading checkpoint: ..."); ok statuses stay ok.
  Status with_context(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status error(ErrorCode code, std::string message) { return Status(code, std::move(message)); }

// Either a T or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    GOSSAMER_CHECK(!std::get<1>(state_).ok(), "a Result cannot hold an ok Status without a value");
  }

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  // The status: ok when a value is held.
  Status status() const { return ok() ? Status() : std::get<1>(state_); }

  // Accessing the value of an error Result is a caller bug.
  T& value() & {
    check_value();
    return std::get<0>(state_);
  }
  const T& value() const& {
    check_value();
    return std::get<0>(state_);
  }
  T&& value() && {
    check_value();
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<0>(state_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void check_value() const {
    GOSSAMER_CHECK(ok(), "value() called on a failed Result: " + std::get<1>(state_).to_string());
  }
  std::variant<T, Status> state_;
};

}  // namespace gossamer
