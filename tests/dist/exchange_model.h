// A host-only model of group_cast / group_reduce over all ranks at once, independent of the
// library's layout code: per (source, receiver) row streams, walked in split order. Tests
// compare each rank's real output with the model's, row by row, naming the misrouted row.
// Random cases are generated from one seed on every rank, so all ranks agree on them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "magi/plan.h"

namespace magi::testing {

using plan::GroupCollectiveArgs;
using plan::GroupReduceArgs;

struct CastCase {
  std::string name;
  std::vector<GroupCollectiveArgs> args;  // [rank]
  std::vector<std::int64_t> input_rows;   // [rank] buffer rows (>= sum of splits)
  std::vector<std::int64_t> output_rows;  // [rank]
};

struct RowId {
  int rank = -1;  // -1: the row is not written
  std::int64_t row = -1;
  friend bool operator==(const RowId&, const RowId&) = default;
};

inline std::int64_t sum(const std::vector<std::int64_t>& xs) {
  std::int64_t n = 0;
  for (auto x : xs) n += x;
  return n;
}

// Source row behind each output row of `rank`.
inline std::vector<RowId> expected_cast(const CastCase& c, int rank) {
  const int size = int(c.args.size());
  std::vector<std::vector<RowId>> stream(static_cast<std::size_t>(size));  // from each source to `rank`
  for (int s = 0; s < size; ++s) {
    const GroupCollectiveArgs& a = c.args[std::size_t(s)];
    std::int64_t off = 0;
    for (std::size_t i = 0; i < a.input_split_sizes.size(); ++i) {
      if (std::find(a.dst_ranks[i].begin(), a.dst_ranks[i].end(), rank) != a.dst_ranks[i].end())
        for (std::int64_t k = 0; k < a.input_split_sizes[i]; ++k)
          stream[std::size_t(s)].push_back({s, off + k});
      off += a.input_split_sizes[i];
    }
  }
  std::vector<RowId> out(std::size_t(c.output_rows[std::size_t(rank)]));
  std::vector<std::size_t> cursor(std::size_t(size), 0);
  const GroupCollectiveArgs& a = c.args[std::size_t(rank)];
  std::int64_t off = 0;
  for (std::size_t j = 0; j < a.output_split_sizes.size(); ++j) {
    auto s = std::size_t(a.src_rank[j]);
    for (std::int64_t k = 0; k < a.output_split_sizes[j]; ++k)
      out[std::size_t(off + k)] = stream[s].at(cursor[s]++);
    off += a.output_split_sizes[j];
  }
  return out;
}

// Contributions (source rank, source row) to each output row of `rank` under reduce args.
inline std::vector<std::vector<RowId>> expected_reduce(const std::vector<GroupReduceArgs>& args,
                                                        std::int64_t output_rows, int rank) {
  const int size = int(args.size());
  std::vector<std::vector<RowId>> stream(static_cast<std::size_t>(size));
  for (int s = 0; s < size; ++s) {
    const GroupReduceArgs& a = args[std::size_t(s)];
    std::int64_t off = 0;
    for (std::size_t i = 0; i < a.input_split_sizes.size(); ++i) {
      if (a.dst_rank[i] == rank)
        for (std::int64_t k = 0; k < a.input_split_sizes[i]; ++k)
          stream[std::size_t(s)].push_back({s, off + k});
      off += a.input_split_sizes[i];
    }
  }
  std::vector<std::vector<RowId>> out(static_cast<std::size_t>(output_rows));
  std::vector<std::size_t> cursor(std::size_t(size), 0);
  const GroupReduceArgs& a = args[std::size_t(rank)];
  std::int64_t off = 0;
  for (std::size_t j = 0; j < a.output_split_sizes.size(); ++j) {
    for (std::int32_t s : a.src_ranks[j])
      for (std::int64_t k = 0; k < a.output_split_sizes[j]; ++k)
        out[std::size_t(off + k)].push_back(stream[std::size_t(s)].at(cursor[std::size_t(s)]++));
    off += a.output_split_sizes[j];
  }
  return out;
}

// Irregular splits: empty splits, splits to no rank / every rank, a rank that sends nothing,
// receivers cutting each source's stream at other boundaries and interleaving sources, and
// right padding on both buffers.
inline CastCase random_cast_case(std::mt19937_64& rng, int size, const std::string& name) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  CastCase c{name, std::vector<GroupCollectiveArgs>(static_cast<std::size_t>(size)), {}, {}};
  const int silent = pick(0, size - 1);
  std::vector<std::vector<std::int64_t>> len(std::size_t(size), std::vector<std::int64_t>(std::size_t(size), 0));
  for (int s = 0; s < size; ++s) {
    GroupCollectiveArgs& a = c.args[std::size_t(s)];
    const int num_splits = s == silent && pick(0, 1) ? 0 : pick(0, 6);
    for (int i = 0; i < num_splits; ++i) {
      const std::int64_t n = pick(0, 3) == 0 ? 0 : pick(1, 5);
      std::vector<std::int32_t> dst;
      const int kind = pick(0, 4);
      for (int r = 0; r < size; ++r)
        if (s != silent && (kind == 0 || (kind > 1 && pick(0, 2) == 0))) dst.push_back(r);
      std::shuffle(dst.begin(), dst.end(), rng);
      for (std::int32_t r : dst) len[std::size_t(s)][std::size_t(r)] += n;
      a.input_split_sizes.push_back(n);
      a.dst_ranks.push_back(dst);
    }
    c.input_rows.push_back(sum(a.input_split_sizes) + pick(0, 2));
  }
  for (int r = 0; r < size; ++r) {
    std::vector<std::vector<std::int64_t>> pieces(static_cast<std::size_t>(size));
    for (int s = 0; s < size; ++s) {
      std::int64_t left = len[std::size_t(s)][std::size_t(r)];
      while (left > 0 || pick(0, 5) == 0) {
        const std::int64_t n = std::min<std::int64_t>(left, pick(0, 4));
        pieces[std::size_t(s)].push_back(n);
        left -= n;
      }
    }
    GroupCollectiveArgs& a = c.args[std::size_t(r)];
    std::vector<std::size_t> next(std::size_t(size), 0);
    for (bool more = true; more;) {
      std::vector<int> ready;
      for (int s = 0; s < size; ++s)
        if (next[std::size_t(s)] < pieces[std::size_t(s)].size()) ready.push_back(s);
      more = !ready.empty();
      if (!more) break;
      const int s = ready[std::size_t(pick(0, int(ready.size()) - 1))];
      a.output_split_sizes.push_back(pieces[std::size_t(s)][next[std::size_t(s)]++]);
      a.src_rank.push_back(s);
    }
    c.output_rows.push_back(sum(a.output_split_sizes) + pick(0, 2));
  }
  return c;
}

}  // namespace magi::testing
