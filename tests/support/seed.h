// Seeds for randomised tests: MAGI_TEST_SEED replays a failure; every sweep prints its seed.
#pragma once

#include <cstdint>
#include <string>

namespace magi::testing {

// MAGI_TEST_SEED if set, else `fallback`.
std::uint64_t test_seed(std::uint64_t fallback = 20261129);
// "quick" (default, CI) or "full" from MAGI_TEST_LEVEL.
bool full_level();
// A line to attach to assertion failures: "seed 123 (replay with MAGI_TEST_SEED=123)".
std::string seed_note(std::uint64_t seed);

}  // namespace magi::testing
