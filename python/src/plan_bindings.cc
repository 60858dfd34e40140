// Distributed plans for Python: the plan crosses as its JSON text (the planner's exact,
// versioned value format), so Python needs no mirror of the C++ structs and a plan saved by
// `magiattn plan --json` and one made here are read by the same code (magiattn.viz).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "magi/error.h"
#include "magi/plan.h"
#include "plan_options.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace magi::py {
namespace {

std::string make_plan_json(const Mask& mask, int cp, int num_stages, std::int64_t chunk_size,
                           const std::string& algorithm, bool uneven) {
  const plan::PlanOptions opts = plan_options(cp, num_stages, chunk_size, algorithm, uneven);
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
