// Plans as text: JSON (exact round trip, so a plan computed once can be shipped and checked
// with ==) and a human summary. Ranges are [start, end] pairs and slices [qs, qe, ks, ke, type]
// to keep a 1M-token cp-64 plan at a few MB; doubles print with round-trip precision.
#include <algorithm>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "magi/error.h"
#include "magi/plan.h"

namespace magi::plan {
namespace {

using nlohmann::json;

json ranges_to_json(const std::vector<Range>& ranges) {
  json a = json::array();
  for (Range r : ranges) a.push_back({r.start, r.end});
  return a;
}

json slices_to_json(const std::vector<Slice>& slices) {
  json a = json::array();
  for (const Slice& s : slices)
    a.push_back({s.q_range.start, s.q_range.end, s.k_range.start, s.k_range.end, int(s.type)});
  return a;
}

// Reading: every access names its path so a broken file says where ("ranks[3].stages[1]...").
const json& field(const json& j, const char* key, const std::string& where) {
  MAGI_CHECK(j.is_object(), "plan json: ", where, " is not an object");
  const auto it = j.find(key);
  MAGI_CHECK(it != j.end(), "plan json: ", where, " has no field '", key, "'");
  return *it;
}

const json& array_of(const json& j, const std::string& where, std::size_t size = 0) {
  MAGI_CHECK(j.is_array(), "plan json: ", where, " is not an array");
  MAGI_CHECK(size == 0 || j.size() == size, "plan json: ", where, " has ", j.size(),
             " entries, expected ", size);
  return j;
}

std::int64_t int_of(const json& j, const std::string& where) {
  MAGI_CHECK(j.is_number_integer(), "plan json: ", where, " is not an integer");
  return j.get<std::int64_t>();
}

double double_of(const json& j, const std::string& where) {
  MAGI_CHECK(j.is_number(), "plan json: ", where, " is not a number");
  return j.get<double>();
}

template <typename T>
std::vector<T> ints_of(const json& j, const std::string& where) {
  std::vector<T> out;
  for (std::size_t i = 0; i < array_of(j, where).size(); ++i)
    out.push_back(T(int_of(j[i], where + "[" + std::to_string(i) + "]")));
  return out;
}

std::vector<Range> ranges_of(const json& j, const std::string& where) {
  std::vector<Range> out;
  for (std::size_t i = 0; i < array_of(j, where).size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const json& r = array_of(j[i], w, 2);
    out.push_back({int_of(r[0], w), int_of(r[1], w)});
    MAGI_CHECK(out.back().start <= out.back().end, "plan json: ", w, " range ",
               to_string(out.back()), " is reversed");
  }
  return out;
}

std::vector<Slice> slices_of(const json& j, const std::string& where) {
  std::vector<Slice> out;
  for (std::size_t i = 0; i < array_of(j, where).size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const json& s = array_of(j[i], w, 5);
    Slice slice{{int_of(s[0], w), int_of(s[1], w)},
                {int_of(s[2], w), int_of(s[3], w)},
                mask_type_from_int(int_of(s[4], w), w)};
    MAGI_CHECK(slice.q_range.start <= slice.q_range.end && slice.k_range.start <= slice.k_range.end,
               "plan json: ", w, " has a reversed range: ", to_string(slice));
    out.push_back(slice);
  }
  return out;
}

}  // namespace

std::string DistPlan::to_json(int indent) const {
  json j;
  j["format"] = "magi.plan.v1";
  j["dispatch"] = {{"cp", dispatch.cp},
                   {"total_seqlen", dispatch.total_seqlen},
                   {"chunk_size", dispatch.chunk_size},
                   {"chunk_area", dispatch.chunk_area},
                   {"rank_chunks", dispatch.rank_chunks},
                   {"rank_area", dispatch.rank_area}};
  j["cost"] = {{"seconds_per_cell", cost.seconds_per_cell},
               {"bytes_per_row", cost.bytes_per_row},
               {"bytes_per_second", cost.bytes_per_second},
               {"seconds_per_message", cost.seconds_per_message}};
  j["predicted_seconds"] = predicted_seconds;
  json ranks_json = json::array();
  for (const RankPlan& rp : ranks) {
    json stages = json::array();
    for (const Stage& st : rp.stages) {
      stages.push_back({{"remote_k_ranges", ranges_to_json(st.remote_k_ranges)},
                        {"slices", slices_to_json(st.slices)},
                        {"area", st.area},
                        {"input_split_sizes", st.cast.input_split_sizes},
                        {"dst_ranks", st.cast.dst_ranks},
                        {"output_split_sizes", st.cast.output_split_sizes},
                        {"src_rank", st.cast.src_rank}});
    }
    ranks_json.push_back({{"host_ranges", ranges_to_json(rp.host_ranges)},
                          {"host_slices", slices_to_json(rp.host_slices)},
                          {"host_area", rp.host_area},
                          {"stages", std::move(stages)}});
  }
  j["ranks"] = std::move(ranks_json);
  return j.dump(indent);
}

DistPlan plan_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    MAGI_FAIL("plan json: not valid JSON: ", e.what());
  }
  const json& format = field(j, "format", "plan");
  MAGI_CHECK(format.is_string() && format.get<std::string>() == "magi.plan.v1",
             "plan json: format ", format.dump(), " is not \"magi.plan.v1\"");
  DistPlan p;
  const json& d = field(j, "dispatch", "plan");
  p.dispatch.cp = int(int_of(field(d, "cp", "dispatch"), "dispatch.cp"));
  MAGI_CHECK(p.dispatch.cp >= 1, "plan json: dispatch.cp ", p.dispatch.cp, " must be >= 1");
  p.dispatch.total_seqlen = int_of(field(d, "total_seqlen", "dispatch"), "dispatch.total_seqlen");
  p.dispatch.chunk_size = int_of(field(d, "chunk_size", "dispatch"), "dispatch.chunk_size");
  p.dispatch.chunk_area =
      ints_of<std::int64_t>(field(d, "chunk_area", "dispatch"), "dispatch.chunk_area");
  const json& rc = array_of(field(d, "rank_chunks", "dispatch"), "dispatch.rank_chunks",
                            std::size_t(p.dispatch.cp));
  for (std::size_t r = 0; r < rc.size(); ++r)
    p.dispatch.rank_chunks.push_back(
        ints_of<std::int32_t>(rc[r], "dispatch.rank_chunks[" + std::to_string(r) + "]"));
  p.dispatch.rank_area =
      ints_of<std::int64_t>(field(d, "rank_area", "dispatch"), "dispatch.rank_area");
  const json& c = field(j, "cost", "plan");
  p.cost.seconds_per_cell =
      double_of(field(c, "seconds_per_cell", "cost"), "cost.seconds_per_cell");
  p.cost.bytes_per_row = double_of(field(c, "bytes_per_row", "cost"), "cost.bytes_per_row");
  p.cost.bytes_per_second =
      double_of(field(c, "bytes_per_second", "cost"), "cost.bytes_per_second");
  p.cost.seconds_per_message =
      double_of(field(c, "seconds_per_message", "cost"), "cost.seconds_per_message");
  p.predicted_seconds = double_of(field(j, "predicted_seconds", "plan"), "predicted_seconds");
  const json& ranks = array_of(field(j, "ranks", "plan"), "ranks", std::size_t(p.dispatch.cp));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string w = "ranks[" + std::to_string(r) + "]";
    RankPlan rp;
    rp.host_ranges = ranges_of(field(ranks[r], "host_ranges", w), w + ".host_ranges");
    rp.host_slices = slices_of(field(ranks[r], "host_slices", w), w + ".host_slices");
    rp.host_area = int_of(field(ranks[r], "host_area", w), w + ".host_area");
    const json& stages = array_of(field(ranks[r], "stages", w), w + ".stages");
    for (std::size_t t = 0; t < stages.size(); ++t) {
      const std::string ws = w + ".stages[" + std::to_string(t) + "]";
      const json& sj = stages[t];
      Stage st;
      st.remote_k_ranges = ranges_of(field(sj, "remote_k_ranges", ws), ws + ".remote_k_ranges");
      st.slices = slices_of(field(sj, "slices", ws), ws + ".slices");
      st.area = int_of(field(sj, "area", ws), ws + ".area");
      st.cast.input_split_sizes =
          ints_of<std::int64_t>(field(sj, "input_split_sizes", ws), ws + ".input_split_sizes");
      const json& dst =
          array_of(field(sj, "dst_ranks", ws), ws + ".dst_ranks", st.cast.input_split_sizes.size());
      for (std::size_t i = 0; i < dst.size(); ++i)
        st.cast.dst_ranks.push_back(
            ints_of<std::int32_t>(dst[i], ws + ".dst_ranks[" + std::to_string(i) + "]"));
      st.cast.output_split_sizes =
          ints_of<std::int64_t>(field(sj, "output_split_sizes", ws), ws + ".output_split_sizes");
      st.cast.src_rank = ints_of<std::int32_t>(field(sj, "src_rank", ws), ws + ".src_rank");
      MAGI_CHECK(st.cast.src_rank.size() == st.cast.output_split_sizes.size(), "plan json: ", ws,
                 ": ", st.cast.src_rank.size(), " src_rank entries for ",
                 st.cast.output_split_sizes.size(), " output splits");
      rp.stages.push_back(std::move(st));
    }
    MAGI_CHECK(r == 0 || rp.stages.size() == p.ranks[0].stages.size(), "plan json: ", w, " has ",
               rp.stages.size(), " stages but ranks[0] has ", p.ranks[0].stages.size(),
               " (the collective runs per stage on all ranks)");
    p.ranks.push_back(std::move(rp));
  }
  return p;
}

std::string DistPlan::summary() const {
  std::ostringstream os;
  const std::size_t num_stages = ranks.empty() ? 0 : ranks[0].stages.size();
  std::int64_t total_area = 0, max_area = 0;
  for (const RankPlan& rp : ranks) {
    std::int64_t a = rp.host_area;
    for (const Stage& st : rp.stages) a += st.area;
    total_area += a;
    max_area = std::max(max_area, a);
  }
  const double mean = ranks.empty() ? 0.0 : double(total_area) / double(ranks.size());
  os << "cp " << dispatch.cp << "  tokens " << dispatch.total_seqlen << "  chunk "
     << dispatch.chunk_size << "  stages " << num_stages << "  area " << total_area << "\n";
  os << "imbalance " << std::fixed << std::setprecision(2)
     << (mean > 0 ? (double(max_area) / mean - 1) * 100 : 0.0) << "%  predicted "
     << std::setprecision(1) << predicted_seconds * 1e6 << " us (forward, cost model)\n";
  os << "rank  tokens  area  host_area  per stage: bytes in / bytes out\n";
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankPlan& rp = ranks[r];
    std::int64_t tokens = 0, area = rp.host_area;
    for (Range h : rp.host_ranges) tokens += h.size();
    for (const Stage& st : rp.stages) area += st.area;
    os << r << "  " << tokens << "  " << area << "  " << rp.host_area << " ";
    for (std::size_t t = 0; t < rp.stages.size(); ++t) {
      std::int64_t in = 0, out = 0;
      for (std::int64_t s : rp.stages[t].cast.output_split_sizes) in += s;
      const auto& cast = rp.stages[t].cast;
      for (std::size_t i = 0; i < cast.input_split_sizes.size(); ++i)
        out += cast.input_split_sizes[i] * std::int64_t(cast.dst_ranks[i].size());
      os << " " << std::int64_t(double(in) * cost.bytes_per_row) << "/"
         << std::int64_t(double(out) * cost.bytes_per_row);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace magi::plan
