// Distributed plans for Python: the plan crosses as its JSON text (the planner's exact,
// versioned value format), so Python needs no mirror of the C++ structs and a plan saved by
// `magiattn plan --json` and one made here are read by the same code (magiattn.viz).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "magi/error.h"
#include "magi/plan.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace magi::py {
namespace {

std::string make_plan_json(const Mask& mask, int cp, int num_stages, std::int64_t chunk_size,
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
  nb::gil_scoped_release release;
  return plan::make_plan(mask, opts).to_json();
}

}  // namespace

void bind_plan(nb::module_& m) {
  m.def("make_plan_json", &make_plan_json, "mask"_a, "cp"_a, "num_stages"_a = 0,
        "chunk_size"_a = 0, "algorithm"_a = "refined", "uneven"_a = false,
        "The distributed plan of `mask` over `cp` ranks, as the planner's JSON text.");
}

}  // namespace magi::py
