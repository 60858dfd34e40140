// JSON mask files (docs/semantics.md §1). Structure errors are reported here with the field and
// index (`q_ranges[3]: expected [start, end]`); range bounds and overlaps are left to the Mask
// constructor, whose "slice i" is entry i of every array. Pretty output keeps one field per line
// with its array inline, so a file of 10^4 slices stays 5 lines instead of 10^5.
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "magi/error.h"
#include "magi/mask_json.h"

namespace magi {
namespace {

using nlohmann::json;

std::int64_t as_int(const json& v, const std::string& what) {
  MAGI_CHECK(v.is_number_integer(), what, ": expected an integer, got ", v.dump());
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    MAGI_CHECK(u <= std::uint64_t(std::numeric_limits<std::int64_t>::max()), what, ": ", u,
               " does not fit in int64");
  }
  return v.get<std::int64_t>();
}

const json& field(const json& root, const char* name) {
  const auto it = root.find(name);
  MAGI_CHECK(it != root.end(), "mask JSON: missing field \"", name, "\"");
  return *it;
}

const json& array_field(const json& root, const char* name) {
  const json& v = field(root, name);
  MAGI_CHECK(v.is_array(), name, ": expected an array, got ", v.type_name());
  return v;
}

std::vector<Range> ranges(const json& root, const char* name) {
  const json& arr = array_field(root, name);
  std::vector<Range> out;
  out.reserve(arr.size());
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
    const json& r = arr[i];
    MAGI_CHECK(r.is_array() && r.size() == 2, what, ": expected [start, end], got ", r.dump());
    out.push_back({as_int(r[0], what + "[0]"), as_int(r[1], what + "[1]")});
  }
  return out;
}

MaskType type_of(const json& v, const std::string& what) {
  if (v.is_string()) return mask_type_from_name(v.get<std::string>(), what);
  MAGI_CHECK(v.is_number_integer(), what,
             ": expected 0..3 or \"full\", \"causal\", \"inv_causal\", \"bi_causal\", got ",
             v.dump());
  return mask_type_from_int(as_int(v, what), what);
}

}  // namespace

std::string mask_to_json(const Mask& mask, int indent) {
  json q = json::array(), k = json::array(), t = json::array();
  for (const Slice& s : mask.slices()) {
    q.push_back({s.q_range.start, s.q_range.end});
    k.push_back({s.k_range.start, s.k_range.end});
    t.push_back(static_cast<int>(s.type));
  }
  const std::pair<const char*, json> fields[] = {{"total_seqlen_q", mask.total_seqlen_q()},
                                                 {"total_seqlen_k", mask.total_seqlen_k()},
                                                 {"q_ranges", q},
                                                 {"k_ranges", k},
                                                 {"attn_type_map", t}};
  if (indent < 0) {
    json root = json::object();
    for (const auto& [name, value] : fields) root[name] = value;
    return root.dump();
  }
  std::ostringstream os;
  os << "{\n";
  for (std::size_t i = 0; i < std::size(fields); ++i) {
    os << std::string(std::size_t(indent), ' ') << '"' << fields[i].first
       << "\": " << fields[i].second.dump() << (i + 1 < std::size(fields) ? ",\n" : "\n");
  }
  os << "}\n";
  return os.str();
}

Mask mask_from_json(std::string_view text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    MAGI_FAIL("mask JSON is not valid JSON: ", e.what());
  }
  MAGI_CHECK(root.is_object(), "mask JSON: expected an object at the top level, got ",
             root.type_name());
  const std::int64_t total_q = as_int(field(root, "total_seqlen_q"), "total_seqlen_q");
  const std::int64_t total_k = as_int(field(root, "total_seqlen_k"), "total_seqlen_k");
  const std::vector<Range> q = ranges(root, "q_ranges");
  const std::vector<Range> k = ranges(root, "k_ranges");
  const json& types = array_field(root, "attn_type_map");
  MAGI_CHECK(q.size() == k.size(), "q_ranges has ", q.size(), " entries but k_ranges has ",
             k.size());
  MAGI_CHECK(types.size() == q.size(), "attn_type_map has ", types.size(),
             " entries but q_ranges has ", q.size());
  std::vector<Slice> slices(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    slices[i] = {q[i], k[i], type_of(types[i], "attn_type_map[" + std::to_string(i) + "]")};
  }
  return Mask(total_q, total_k, std::move(slices));
}

Mask load_mask(const std::string& path) {
  std::ifstream in(path);
  MAGI_CHECK(in.good(), "cannot open mask file '", path, "'");
  std::ostringstream buf;
  buf << in.rdbuf();
  try {
    return mask_from_json(buf.str());
  } catch (const Error& e) {  // the path before the message, the check's location after it
    const std::string msg = e.message();
    throw Error(path + ": " + msg, std::string(e.what()).substr(msg.size()));
  }
}

void save_mask(const Mask& mask, const std::string& path) {
  std::ofstream out(path);
  MAGI_CHECK(out.good(), "cannot write mask file '", path, "'");
  out << mask_to_json(mask, 2);
  out.close();
  MAGI_CHECK(!out.fail(), "failed writing mask file '", path, "'");
}

}  // namespace magi
