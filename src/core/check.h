// GOSSAMER_CHECK: the one way to report a caller's bug (a broken precondition or invariant).
// It throws gossamer::ContractError; it never aborts the process. Failures that the network, a file
// or another machine can cause are Status values instead (core/status.h).
#pragma once

#include <stdexcept>
#include <string>

namespace gossamer {

class ContractError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void throw_contract_error(const char* condition, const char* file, int line, const std::string& message);

}  // namespace gossamer

#define GOSSAMER_CHECK(condition, message)                                              \
  do {                                                                                  \
    if (!(condition)) ::gossamer::throw_contract_error(#condition, __FILE__, __LINE__, (message)); \
  } while (false)
