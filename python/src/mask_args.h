// A Mask from Python's ranges and types (MagiAttention's q_ranges / k_ranges / attn_type_map),
// one reading for both modules: magiattn._C (class Mask) and magiattn._dist (make_plan, the
// key's plan from the mask's parts).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "magi/mask.h"

namespace magi::py {

namespace nb = nanobind;

// Ranges an int [N, 2] array; types ints or names ("causal"), mixed in a list; None = FULL.
Mask make_mask(std::int64_t total_seqlen_q, std::int64_t total_seqlen_k, nb::handle q_ranges,
               nb::handle k_ranges, nb::handle attn_type_map);

}  // namespace magi::py
