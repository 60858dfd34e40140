// AttnOptions from the keyword arguments that every attention binding takes (magiattn._C and
// magiattn._dist build the same options from the same names).
#pragma once

#include <optional>
#include <string>

#include "magi/attention.h"

namespace magi::py {

inline AttnOptions attn_options(std::optional<double> softmax_scale, double softcap,
                                const std::string& sink_layout, bool accumulate, bool deterministic,
                                int num_threads, int sm_margin = 0) {
  AttnOptions o;
  o.softmax_scale = softmax_scale;
  o.softcap = softcap;
  o.sink_layout = sink_layout_from_name(sink_layout);
  o.accumulate = accumulate;
  o.deterministic = deterministic;
  o.num_threads = num_threads;
  o.sm_margin = sm_margin;  // validated (>= 0) by attn_forward / attn_backward; CPU ignores it
  return o;
}

}  // namespace magi::py
