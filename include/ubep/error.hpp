// Error hierarchy of ubep. Every failure the library reports is a ubep::Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ubep {

// Base class of every exception thrown by ubep.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed a bad value (shape, dtype, expert id, capacity...). Nothing was sent:
// the group and the buffer stay usable.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A peer did not arrive within the group's timeout (dead, stuck, or calling something else).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer failed the call this rank waits in (it rejected its input, or its buffer is broken):
// the wait ends at once, naming the rank and the call, instead of running into the timeout.
class PeerFailedError : public Error {
 public:
  using Error::Error;
};

// The Buffer can no longer be used: an earlier call failed after the ranks started it (a
// timeout, a failed peer), so they are out of step. Every later call throws this at once,
// naming the call and the cause; create a new Buffer on the group.
class BrokenBufferError : public Error {
 public:
  using Error::Error;
};

// A system or MPI call failed.
class SystemError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ubep

// UBEP_CHECK(cond, ExceptionType, message parts...): throw ExceptionType naming the bad value.
#define UBEP_CHECK(cond, Exc, ...)                               \
  do {                                                           \
    if (!(cond)) throw Exc(::ubep::detail::concat(__VA_ARGS__)); \
  } while (0)

#define UBEP_CHECK_ARG(cond, ...) UBEP_CHECK(cond, ::ubep::InvalidArgument, __VA_ARGS__)
