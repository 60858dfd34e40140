// class Mask and JSON mask files. A Mask is an immutable value: Python gets ==, hash, pickling
// (through the JSON text, the one serialised form) and numpy views of its parts as fresh
// arrays, never references into the C++ object, so nothing can dangle or mutate it.
#include <nanobind/nanobind.h>
#include <nanobind/operators.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "magi/error.h"
#include "magi/mask.h"
#include "magi/mask_builders.h"
#include "magi/mask_json.h"
#include "mask_args.h"

namespace magi::py {
namespace {

using namespace nb::literals;

std::string repr(const Mask& m) {
  return "Mask(" + std::to_string(m.total_seqlen_q()) + " x " + std::to_string(m.total_seqlen_k()) +
         ", " + std::to_string(m.size()) + (m.size() == 1 ? " slice" : " slices") + ", area " +
         std::to_string(m.area()) + ")";
}

nb::ndarray<nb::numpy, std::int64_t> ranges_of(const Mask& m, Range Slice::*which) {
  std::vector<std::int64_t> v;
  v.reserve(2 * m.size());
  for (const Slice& s : m.slices()) {
    v.push_back((s.*which).start);
    v.push_back((s.*which).end);
  }
  return to_numpy(std::move(v), {m.size(), 2});
}

using SliceTuple = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>;

}  // namespace

void bind_mask(nb::module_& m) {
  nb::class_<Mask>(m, "Mask", "A validated list of non-overlapping slices (docs/semantics.md §1)")
      .def(
          "__init__",
          [](Mask* self, std::int64_t sq, std::int64_t sk, nb::handle q_ranges, nb::handle k_ranges,
             nb::handle attn_type_map) {
            new (self) Mask(make_mask(sq, sk, q_ranges, k_ranges, attn_type_map));
          },
          "total_seqlen_q"_a, "total_seqlen_k"_a, "q_ranges"_a, "k_ranges"_a,
          "attn_type_map"_a.none() = nb::none())
      .def_prop_ro("total_seqlen_q", &Mask::total_seqlen_q)
      .def_prop_ro("total_seqlen_k", &Mask::total_seqlen_k)
      .def("__len__", &Mask::size)
      .def(nb::self == nb::self)
      .def("__hash__",
           [](const Mask& self) { return std::hash<std::string>{}(mask_to_json(self)); })
      .def("__repr__", &repr)
      .def("to_string", &Mask::to_string, "One line per slice, after a summary line")
      .def("area", [](const Mask& self) { return self.area(); })
      .def(
          "area",
          [](const Mask& self, std::int64_t q_start, std::int64_t q_end) {
            return self.area(Range{q_start, q_end});
          },
          "q_start"_a, "q_end"_a)
      .def(
          "area",
          [](const Mask& self, std::int64_t q_start, std::int64_t q_end, std::int64_t k_start,
             std::int64_t k_end) {
            return self.area(Range{q_start, q_end}, Range{k_start, k_end});
          },
          "q_start"_a, "q_end"_a, "k_start"_a, "k_end"_a)
      .def("sparsity", &Mask::sparsity)
      .def("visible", &Mask::visible, "q"_a, "k"_a)
      .def("q_ranges", [](const Mask& self) { return ranges_of(self, &Slice::q_range); })
      .def("k_ranges", [](const Mask& self) { return ranges_of(self, &Slice::k_range); })
      .def("attn_type_map",
           [](const Mask& self) {
             std::vector<std::int32_t> v;
             for (const Slice& s : self.slices()) v.push_back(std::int32_t(s.type));
             return to_numpy(std::move(v), {self.size()});
           })
      .def(
          "slices",
          [](const Mask& self) {
            std::vector<SliceTuple> v;
            for (const Slice& s : self.slices())
              v.emplace_back(s.q_range.start, s.q_range.end, s.k_range.start, s.k_range.end,
                             int(s.type));
            return v;
          },
          "(q_start, q_end, k_start, k_end, type) per slice")
      .def(
          "classify_tiles",
          [](const Mask& self, std::int64_t block_q, std::int64_t block_k) {
            const TileGrid g = self.classify_tiles(block_q, block_k);
            std::vector<std::uint8_t> v(g.tiles.size());
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::uint8_t(g.tiles[i]);
            return to_numpy(std::move(v), {std::size_t(g.num_q_tiles), std::size_t(g.num_k_tiles)});
          },
          "block_q"_a, "block_k"_a, "uint8 [num_q_tiles, num_k_tiles]: 0 empty, 1 partial, 2 full")
      .def("to_dense",
           [](const Mask& self) {
             return to_numpy_bool(masks::to_dense(self), {std::size_t(self.total_seqlen_q()),
                                                          std::size_t(self.total_seqlen_k())});
           })
      .def("to_json", &mask_to_json, "indent"_a = -1)
      .def("__getstate__", [](const Mask& self) { return mask_to_json(self); })
      .def("__setstate__",
           [](Mask& self, const std::string& state) { new (&self) Mask(mask_from_json(state)); });

  m.def(
      "mask_from_json", [](const std::string& text) { return mask_from_json(text); }, "text"_a);
  m.def(
      "load_mask", [](const std::filesystem::path& path) { return load_mask(path.string()); },
      "path"_a);
  m.def(
      "save_mask",
      [](const Mask& mask, const std::filesystem::path& path) { save_mask(mask, path.string()); },
      "mask"_a, "path"_a);
}

}  // namespace magi::py
