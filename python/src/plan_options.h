// The planner's options from the Python arguments (DistAttnConfig's fields), one definition for
// both modules: magiattn._C (make_plan_json, the planning API) and magiattn._dist (make_plan,
// the key's plan as a C++ value).
#pragma once

#include <cstdint>
#include <string>

#include "magi/error.h"
#include "magi/plan.h"

namespace magi::py {

inline plan::PlanOptions plan_options(int cp, int num_stages, std::int64_t chunk_size,
                                      const std::string& algorithm, bool uneven) {
  plan::PlanOptions opts;
  opts.dispatch.cp = cp;
  opts.dispatch.chunk_size = chunk_size;
  opts.dispatch.uneven = uneven;
  MAGI_CHECK(algorithm == "refined" || algorithm == "minheap", "algorithm '", algorithm,
             "' is not \"refined\" or \"minheap\"");
  opts.dispatch.algorithm = algorithm == "refined" ? plan::DispatchAlgorithm::kRefined
                                                   : plan::DispatchAlgorithm::kMinHeap;
  opts.num_stages = num_stages;
  return opts;
}

}  // namespace magi::py
