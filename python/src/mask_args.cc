// mask_args.h: ranges and types from Python into a Mask.
#include "mask_args.h"

#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "magi/error.h"

namespace magi::py {
namespace {

std::vector<Range> read_ranges(nb::handle obj, const char* name) {
  const IntArray a = read_ints(obj, name, 2);
  MAGI_CHECK(a.shape[1] == 2 || a.shape[0] == 0, name, ": shape [", a.shape[0], ", ", a.shape[1],
             "] is not [N, 2]");
  std::vector<Range> ranges(std::size_t(a.shape[0]));
  for (std::size_t i = 0; i < ranges.size(); ++i)
    ranges[i] = Range{a.values[2 * i], a.values[2 * i + 1]};
  return ranges;
}

bool is_text(nb::handle h) { return nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h); }

// Types as ints (any integer array) or names ("causal"), mixed freely in a list; None = FULL.
std::vector<MaskType> read_types(nb::handle obj, std::size_t num_slices) {
  if (obj.is_none()) return std::vector<MaskType>(num_slices, MaskType::kFull);
  nb::object seq = nb::borrow(obj);
  if (nb::hasattr(obj, "dtype") && nb::hasattr(obj, "tolist")) {
    const std::string kind = nb::cast<std::string>(obj.attr("dtype").attr("kind"));
    if (kind == "U" || kind == "S") seq = obj.attr("tolist")();  // numpy array of names
  }
  std::vector<MaskType> types;
  bool has_names = false;
  if (nb::isinstance<nb::list>(seq) || nb::isinstance<nb::tuple>(seq))
    for (nb::handle item : seq) has_names = has_names || is_text(item);
  if (has_names) {
    std::size_t i = 0;
    for (nb::handle item : seq) {
      const std::string what = "attn_type_map[" + std::to_string(i++) + "]";
      types.push_back(is_text(item) ? mask_type_from_name(nb::cast<std::string>(item), what)
                                    : mask_type_from_int(nb::cast<std::int64_t>(item), what));
    }
  } else {
    const IntArray a = read_ints(seq, "attn_type_map", 1);
    for (std::size_t i = 0; i < a.values.size(); ++i)
      types.push_back(mask_type_from_int(a.values[i], "attn_type_map[" + std::to_string(i) + "]"));
  }
  MAGI_CHECK(types.size() == num_slices, "attn_type_map: ", types.size(),
             " entries, but q_ranges and k_ranges have ", num_slices);
  return types;
}

}  // namespace

Mask make_mask(std::int64_t total_seqlen_q, std::int64_t total_seqlen_k, nb::handle q_ranges,
               nb::handle k_ranges, nb::handle attn_type_map) {
  const std::vector<Range> q = read_ranges(q_ranges, "q_ranges");
  const std::vector<Range> k = read_ranges(k_ranges, "k_ranges");
  MAGI_CHECK(q.size() == k.size(), "q_ranges has ", q.size(), " entries but k_ranges has ",
             k.size());
  const std::vector<MaskType> types = read_types(attn_type_map, q.size());
  std::vector<Slice> slices(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) slices[i] = Slice{q[i], k[i], types[i]};
  return Mask(total_seqlen_q, total_seqlen_k, std::move(slices));
}

}  // namespace magi::py
