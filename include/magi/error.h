// magi::Error and the checking macros. One exception type for the whole library: every
// message names the culprit and carries file:line plus the failed expression, so a user can
// act on it without reading our source.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace magi {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // what() is message + where (the " (check ... failed at file:line)" suffix of MAGI_CHECK).
  Error(const std::string& message, const std::string& where)
      : std::runtime_error(message + where), message_size_(message.size()) {}

  // The message without the where suffix (all of what() when the error was built without
  // one): what a command line shows a user, while what() goes to logs and bug reports.
  std::string message() const { return std::string(what()).substr(0, message_size_); }

 private:
  std::size_t message_size_ = std::string::npos;
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
  throw Error(cat(args...), expr ? " (check `" + std::string(expr) + "` failed at " + where + ")"
                                 : " (at " + where + ")");
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
