// The text of the magi::Error a callable throws, or "(no error)": lets a test assert on the
// message naming the culprit with EXPECT_THAT(error_of(...), HasSubstr(...)).
#pragma once

#include <string>

#include "magi/error.h"

namespace magi::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace magi::testing
