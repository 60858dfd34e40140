// magi::Error and the checking macros. One exception type for the whole library: every
// message names the culprit and carries file:line plus the failed expression, so a user can
// act on it without reading our source.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace magi {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const char* file, int line, const char* expr, const Args&... args) {
  const std::string where = std::string(file) + ":" + std::to_string(line);
  throw Error(cat(args...) + (expr ? " (check `" + std::string(expr) + "` failed at " + where + ")"
                                   : " (at " + where + ")"));
}

}  // namespace detail
}  // namespace magi

// MAGI_CHECK(cond, msg...): throw magi::Error with the message parts concatenated.
#define MAGI_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) ::magi::detail::fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)

// MAGI_FAIL(msg...): throw unconditionally (for ends of functions the compiler must see as noreturn).
#define MAGI_FAIL(...) ::magi::detail::fail(__FILE__, __LINE__, nullptr, __VA_ARGS__)

// Internal invariants: checked in debug builds only.
#ifdef NDEBUG
#define MAGI_DCHECK(cond, ...) \
  do {                         \
  } while (0)
#else
#define MAGI_DCHECK(cond, ...) MAGI_CHECK(cond, "internal invariant: ", __VA_ARGS__)
#endif
