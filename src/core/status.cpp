#include "core/status.h"

#include <filesystem>

namespace gossamer {

void throw_contract_error(const char* condition, const char* file, int line, const std::string& message) {
  const std::string where = std::filesystem::path(file).filename().string() + ":" + std::to_string(line);
  throw ContractError(message + " (check `" + condition + "` failed at " + where + ")");
}

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kOutOfRange: return "out_of_range";
    case ErrorCode::kDataLoss: return "data_loss";
    case ErrorCode::kMalformed: return "malformed";
    case ErrorCode::kVersionMismatch: return "version_mismatch";
    case ErrorCode::kIoError: return "io_error";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerLost: return "peer_lost";
    case ErrorCode::kUnauthenticated: return "unauthenticated";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(gossamer::to_string(code_)) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace gossamer
