// Small arithmetic shared by the backends, the communicators and the oracle.
#pragma once

#include <algorithm>
#include <cmath>

namespace magi {

// max that keeps a NaN from either side: std::max(a, b) returns a when either is NaN, so a NaN
// arriving second would vanish (max_logits and MAX reductions, docs/numerics.md).
template <typename T>
T nan_max(T a, T b) {
  return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b);
}

}  // namespace magi
