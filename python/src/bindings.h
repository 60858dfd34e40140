// The pieces of magiattn._C, one registration function per file, so that module.cc reads as
// the table of contents of the Python-facing C++ API.
#pragma once

#include <nanobind/nanobind.h>

namespace magi::py {

void bind_mask(nanobind::module_& m);       // class Mask, JSON files
void bind_builders(nanobind::module_& m);   // builders, benchmark families, document lengths
void bind_attention(nanobind::module_& m);  // forward, backward, FLOP counts
void bind_plan(nanobind::module_& m);       // distributed plans (as JSON)

}  // namespace magi::py
