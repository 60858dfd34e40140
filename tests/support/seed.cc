#include "seed.h"

#include <cstdlib>
#include <string_view>

namespace magi::testing {

std::uint64_t test_seed(std::uint64_t fallback) {
  const char* env = std::getenv("MAGI_TEST_SEED");
  return env && *env ? std::strtoull(env, nullptr, 10) : fallback;
}

bool full_level() {
  const char* env = std::getenv("MAGI_TEST_LEVEL");
  return env && std::string_view(env) == "full";
}

std::string seed_note(std::uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay with MAGI_TEST_SEED=" + std::to_string(seed) +
         ")";
}

}  // namespace magi::testing
