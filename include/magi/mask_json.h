// JSON mask files (docs/semantics.md §1): {"total_seqlen_q", "total_seqlen_k", "q_ranges",
// "k_ranges", "attn_type_map"}; types as 0..3 or their names. Errors name the offending field and
// index.
#pragma once

#include <string>
#include <string_view>

#include "magi/mask.h"

namespace magi {

std::string mask_to_json(const Mask& mask, int indent = -1);
Mask mask_from_json(std::string_view text);
Mask load_mask(const std::string& path);
void save_mask(const Mask& mask, const std::string& path);

}  // namespace magi
