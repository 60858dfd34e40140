// Dispatch (docs/semantics.md §3, magi_notes §5.1): cut the sequence into equal chunks and give
// every rank the same number of chunks with nearly the same mask area. The reference's LPT min-heap
// is the floor; kRefined then swaps chunk pairs between the most-loaded rank and the others, which
// fixes the reference's own counterexample (areas 8,7,6,5,4,2,2,2 on 2 ranks: 19/17 -> 18/18).
// Chunk areas cost O(slices + chunks touched); 4M tokens of varlen-causal at cp 1024 dispatch in
// ~0.03 s (8192 chunks of 512).

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <set>
#include <utility>

#include "magi/error.h"
#include "magi/plan.h"

namespace magi::plan {
namespace {

// The reference's MIN_CHUNKS_PER_RANK: fewer chunks per rank leaves LPT too little to mix.
constexpr std::int64_t kMinChunksPerRank = 8;
// Automatic chunking doubles the chunks per rank (8, 16, 32, ...) until refined dispatch
// reaches this max/mean; 1.01 leaves half of the benchmark bound (1.02) as margin.
constexpr double kAutoTarget = 1.01;
// ... but stops at 1024 chunks per rank (and at 64-token chunks, below): finer chunks add
// host ranges (more slices, more comm splits). The benchmark masks never pass 16 per rank.
constexpr std::int64_t kMaxChunksPerRank = 1024;
// One FFA tile row block; smaller chunks would cut kernel tiles.
constexpr std::int64_t kTileTokens = 64;

struct Assignment {
  std::vector<std::vector<std::int32_t>> rank_chunks;
  std::vector<std::int64_t> rank_area;

  std::int64_t max_area() const {
    return rank_area.empty() ? 0 : *std::max_element(rank_area.begin(), rank_area.end());
  }
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Visible cells of each chunk's rows: every slice adds its area to the chunks its q range
// covers, so the cost is the number of (slice, chunk) pairs that actually meet.
std::vector<std::int64_t> chunk_areas(const Mask& mask, std::int64_t chunk_size) {
  const std::int64_t total = mask.total_seqlen_q();
  std::vector<std::int64_t> areas(std::size_t(ceil_div(total, chunk_size)), 0);
  for (const Slice& s : mask.slices()) {
    if (s.q_range.empty() || s.k_range.empty()) continue;
    const std::int64_t last = (s.q_range.end - 1) / chunk_size;
    for (std::int64_t c = s.q_range.start / chunk_size; c <= last; ++c) {
      areas[std::size_t(c)] +=
          area(s, Range{c * chunk_size, std::min((c + 1) * chunk_size, total)});
    }
  }
  return areas;
}

// Greedy LPT (magi_notes §5.1): chunks by area descending (ties by chunk id), each to the
// least-loaded rank with room (ties by rank id). With n % cp = r != 0 (uneven), r ranks claim
// one chunk beyond n / cp, so counts differ by at most one; a short last chunk (`pinned`)
// always claims one of them, so token counts differ by at most one chunk too.
Assignment min_heap(const std::vector<std::int64_t>& areas, int cp, std::int32_t pinned) {
  const std::int64_t n = std::int64_t(areas.size());
  const std::int64_t base = n / cp;
  std::int64_t extras_left = n % cp - (pinned >= 0);  // one is kept for the pinned chunk
  std::vector<bool> claimed(std::size_t(cp), false);
  std::vector<std::int32_t> order(areas.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return areas[a] > areas[b]; });

  Assignment out{std::vector<std::vector<std::int32_t>>(std::size_t(cp)),
                 std::vector<std::int64_t>(std::size_t(cp), 0)};
  auto place = [&](std::int32_t chunk, int rank) {
    out.rank_chunks[std::size_t(rank)].push_back(chunk);
    out.rank_area[std::size_t(rank)] += areas[std::size_t(chunk)];
  };
  using Entry = std::pair<std::int64_t, std::int32_t>;  // (load, rank)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (int r = 0; r < cp; ++r) heap.push({0, r});
  for (std::int32_t chunk : order) {
    if (chunk == pinned) {  // least-loaded unclaimed rank; at most cp - 1 are claimed
      int rank = -1;
      for (int r = 0; r < cp; ++r) {
        if (!claimed[std::size_t(r)] &&
            (rank < 0 || out.rank_area[std::size_t(r)] < out.rank_area[std::size_t(rank)]))
          rank = r;
      }
      claimed[std::size_t(rank)] = true;
      place(chunk, rank);
      heap.push({out.rank_area[std::size_t(rank)], rank});  // the old entry goes stale
      continue;
    }
    for (;;) {
      MAGI_DCHECK(!heap.empty(), "dispatch heap ran dry");
      const auto [load, rank] = heap.top();
      heap.pop();
      if (load != out.rank_area[std::size_t(rank)]) continue;  // stale
      const std::int64_t count = std::int64_t(out.rank_chunks[std::size_t(rank)].size());
      const bool claim = count == base && !claimed[std::size_t(rank)] && extras_left > 0;
      if (count >= base + claimed[std::size_t(rank)] && !claim) continue;  // full: drop it
      if (claim) claimed[std::size_t(rank)] = true, --extras_left;
      place(chunk, rank);
      heap.push({out.rank_area[std::size_t(rank)], rank});
      break;
    }
  }
  return out;
}

// Pairwise swaps: trade chunk a of the most-loaded rank M for chunk b of a lighter rank R when
// 0 < a - b < load(M) - load(R); the pair's new max falls by min(d, gap - d), d = a - b. Each
// step takes the best such swap, so the descending load vector falls lexicographically and the
// loop ends. Ranks are scanned lightest first and the scan stops once gap / 2 cannot beat the
// best gain found; a scanned rank costs one binary search per distinct area of M, counted
// against `max_work`. The pinned short chunk stays put (on a rank with one chunk less it would
// unbalance token counts).
void refine(Assignment& asg, const std::vector<std::int64_t>& areas, std::int32_t pinned,
            std::int64_t max_work) {
  const int cp = int(asg.rank_area.size());
  using Item = std::pair<std::int64_t, std::int32_t>;  // (area, chunk)
  std::vector<std::vector<Item>> items{std::size_t(cp)};
  std::set<std::pair<std::int64_t, int>> by_load;  // (load, rank)
  for (int r = 0; r < cp; ++r) {
    auto& mine = items[std::size_t(r)];
    for (std::int32_t c : asg.rank_chunks[std::size_t(r)])
      mine.push_back({areas[std::size_t(c)], c});
    std::sort(mine.begin(), mine.end());
    by_load.insert({asg.rank_area[std::size_t(r)], r});
  }
  std::int64_t work = 0;  // binary searches, ~25 ns each
  while (cp > 1 && work < max_work) {
    const auto [max_load, m] = *by_load.rbegin();
    std::int64_t best_gain = 0;
    int best_r = -1;
    std::size_t best_a = 0, best_b = 0;
    for (auto it = by_load.begin(); it != by_load.end(); ++it) {
      const std::int64_t gap = max_load - it->first;
      if (gap / 2 <= best_gain) break;  // loads only rise from here
      const auto& mine = items[std::size_t(m)];
      const auto& theirs = items[std::size_t(it->second)];
      // O(1) rejects: no pair with 0 < a - b < gap. Sliding windows make most chunk areas
      // equal, and this skips ~all ranks there (4M tokens, cp 1024: 0.3 s -> 0.03 s).
      if (mine.back().first <= theirs.front().first) continue;
      if (mine.front().first - theirs.back().first >= gap) continue;
      for (std::size_t ia = 0; ia < mine.size(); ++ia) {
        if (mine[ia].second == pinned) continue;
        const std::int64_t a = mine[ia].first;
        if (ia > 0 && a == mine[ia - 1].first && mine[ia - 1].second != pinned) continue;
        work += 1;
        const auto pos = std::lower_bound(theirs.begin(), theirs.end(), Item{a - gap / 2, -1});
        for (auto jt = pos - (pos != theirs.begin()); jt != theirs.end() && jt <= pos; ++jt) {
          const std::int64_t d = a - jt->first;
          const std::int64_t gain = std::min(d, gap - d);
          if (jt->second == pinned || d <= 0 || d >= gap || gain <= best_gain) continue;
          best_gain = gain, best_r = it->second, best_a = ia;
          best_b = std::size_t(jt - theirs.begin());
        }
      }
    }
    if (best_r < 0) break;
    auto& mine = items[std::size_t(m)];
    auto& theirs = items[std::size_t(best_r)];
    const Item a = mine[best_a], b = theirs[best_b];
    const std::int64_t d = a.first - b.first;
    by_load.erase({max_load, m});
    by_load.erase({asg.rank_area[std::size_t(best_r)], best_r});
    asg.rank_area[std::size_t(m)] -= d;
    asg.rank_area[std::size_t(best_r)] += d;
    by_load.insert({asg.rank_area[std::size_t(m)], m});
    by_load.insert({asg.rank_area[std::size_t(best_r)], best_r});
    mine.erase(mine.begin() + std::ptrdiff_t(best_a));
    theirs.erase(theirs.begin() + std::ptrdiff_t(best_b));
    mine.insert(std::lower_bound(mine.begin(), mine.end(), b), b);
    theirs.insert(std::lower_bound(theirs.begin(), theirs.end(), a), a);
  }
  for (int r = 0; r < cp; ++r) {
    auto& chunks = asg.rank_chunks[std::size_t(r)];
    chunks.clear();
    for (const Item& it : items[std::size_t(r)]) chunks.push_back(it.second);
  }
}

// Chunks of equal area are interchangeable for balance, so each group of equal areas is
// dealt out again in id order to the same multiset of ranks, ascending: a rank's chunks of
// one area become consecutive. Full mask, cp 8, 64 chunks: rank r gets chunks 8r..8r+7 (one
// host range, not 8 strided ones); a sliding window then needs one window of remote K per run
// rather than one per chunk. Loads are unchanged.
void cluster_equal_areas(Assignment& asg, const std::vector<std::int64_t>& areas,
                         std::int32_t pinned) {
  std::vector<std::int32_t> owner(areas.size());
  for (std::size_t r = 0; r < asg.rank_chunks.size(); ++r) {
    for (std::int32_t c : asg.rank_chunks[r]) owner[std::size_t(c)] = std::int32_t(r);
  }
  std::vector<std::int32_t> order;
  order.reserve(areas.size());
  for (std::int32_t c = 0; c < std::int32_t(areas.size()); ++c) {
    if (c != pinned) order.push_back(c);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return areas[std::size_t(a)] < areas[std::size_t(b)];
  });
  std::vector<std::int32_t> ranks;
  for (std::size_t i = 0, j = 0; i < order.size(); i = j) {
    while (j < order.size() && areas[std::size_t(order[j])] == areas[std::size_t(order[i])]) ++j;
    ranks.clear();
    for (std::size_t k = i; k < j; ++k) ranks.push_back(owner[std::size_t(order[k])]);
    std::sort(ranks.begin(), ranks.end());
    for (std::size_t k = i; k < j; ++k) owner[std::size_t(order[k])] = ranks[k - i];
  }
  for (auto& chunks : asg.rank_chunks) chunks.clear();
  for (std::int32_t c = 0; c < std::int32_t(areas.size()); ++c) {
    asg.rank_chunks[std::size_t(owner[std::size_t(c)])].push_back(c);
  }
}

Assignment assign(const std::vector<std::int64_t>& areas, int cp, std::int32_t pinned,
                  DispatchAlgorithm algo) {
  Assignment out = min_heap(areas, cp, pinned);
  if (algo == DispatchAlgorithm::kRefined) {
    Assignment refined = out;
    // Work budget, in binary searches (~25 ns each): 512 per chunk. The benchmark masks at 4M
    // tokens, cp 1024 converge within 200 per chunk except sliding-window (900: it stops at
    // max/mean 1.0023 instead of 1.0017), and the cap holds a pathological mask near 0.8 s
    // at 65k chunks.
    refine(refined, areas, pinned, 512 * std::int64_t(areas.size()) + 65536);
    if (refined.max_area() <= out.max_area()) out = std::move(refined);
    cluster_equal_areas(out, areas, pinned);
  }
  for (auto& chunks : out.rank_chunks) std::sort(chunks.begin(), chunks.end());
  return out;
}

Dispatch make_dispatch(const Mask& mask, int cp, std::int64_t chunk_size, DispatchAlgorithm algo) {
  Dispatch d;
  d.cp = cp;
  d.total_seqlen = mask.total_seqlen_q();
  d.chunk_size = chunk_size;
  d.chunk_area = chunk_areas(mask, chunk_size);
  const std::int64_t n = d.num_chunks();
  MAGI_CHECK(n <= std::numeric_limits<std::int32_t>::max(), "dispatch: ", n,
             " chunks overflow 32-bit chunk ids (chunk_size ", chunk_size, " is too small)");
  const bool pin = n % cp != 0 && d.total_seqlen % chunk_size != 0;  // short last chunk
  Assignment a = assign(d.chunk_area, cp, pin ? std::int32_t(n - 1) : -1, algo);
  d.rank_chunks = std::move(a.rank_chunks);
  d.rank_area = std::move(a.rank_area);
  return d;
}

// Candidate chunk sizes, coarsest first, for 8, 16, 32, ... chunks per rank: with an exact
// share S = total / cp, the largest divisor of S giving at least that many chunks per rank,
// taken among multiples of 64 when any qualifies (S = 8192: 1024, 512, 256, 128, 64), else
// among divisors >= 64, else any divisor (tiny sequences: tiles do not matter there).
// Uneven sequences take total / (cp * m) rounded down to a multiple of 64.
std::vector<std::int64_t> auto_chunk_sizes(std::int64_t total, int cp) {
  std::vector<std::int64_t> out;
  auto push = [&](std::int64_t c) {
    if (c >= 1 && (out.empty() || c < out.back())) out.push_back(c);
  };
  if (total % cp == 0) {
    const std::int64_t share = total / cp;
    const std::int64_t min_chunks = std::min(kMinChunksPerRank, share);
    std::vector<std::int64_t> divisors;
    for (std::int64_t i = 1; i * i <= share; ++i) {
      if (share % i) continue;
      for (std::int64_t c : {i, share / i}) {
        if (share / c >= min_chunks) divisors.push_back(c);
      }
    }
    auto keep_if = [&](auto pred) {
      if (std::any_of(divisors.begin(), divisors.end(), pred)) {
        divisors.erase(std::remove_if(divisors.begin(), divisors.end(), std::not_fn(pred)),
                       divisors.end());
      }
    };
    keep_if([](std::int64_t c) { return c % kTileTokens == 0; });
    keep_if([](std::int64_t c) { return c >= kTileTokens; });
    std::sort(divisors.rbegin(), divisors.rend());
    for (std::int64_t m = min_chunks; m <= kMaxChunksPerRank; m *= 2) {
      const auto it = std::find_if(divisors.begin(), divisors.end(),
                                   [&](std::int64_t c) { return share / c >= m; });
      if (it == divisors.end()) break;
      push(*it);
    }
    if (out.empty()) push(divisors.back());
    return out;
  }
  const std::int64_t floor_size = total / (cp * kMinChunksPerRank) >= kTileTokens ? kTileTokens : 1;
  for (std::int64_t m = kMinChunksPerRank; m <= kMaxChunksPerRank; m *= 2) {
    std::int64_t c = total / (std::int64_t(cp) * m);
    if (c >= kTileTokens) c -= c % kTileTokens;
    if (c < floor_size) break;
    push(c);
  }
  if (out.empty()) push(std::max<std::int64_t>(1, total / cp));
  return out;
}

}  // namespace

Range Dispatch::chunk_range(std::int64_t chunk_idx) const {
  MAGI_CHECK(chunk_idx >= 0 && chunk_idx < num_chunks(), "chunk ", chunk_idx,
             " is out of range [0, ", num_chunks(), ")");
  return Range{chunk_idx * chunk_size, std::min((chunk_idx + 1) * chunk_size, total_seqlen)};
}

std::vector<Range> Dispatch::host_ranges(int rank) const {
  MAGI_CHECK(rank >= 0 && rank < cp, "rank ", rank, " is out of range [0, ", cp, ")");
  std::vector<Range> out;
  for (std::int32_t c : rank_chunks[std::size_t(rank)]) {
    const Range r = chunk_range(c);
    if (!out.empty() && out.back().end == r.start) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::int64_t Dispatch::rank_tokens(int rank) const {
  std::int64_t n = 0;
  for (const Range& r : host_ranges(rank)) n += r.size();
  return n;
}

std::vector<std::int64_t> Dispatch::permutation() const {
  std::vector<std::int64_t> perm;
  perm.reserve(std::size_t(total_seqlen));
  for (int r = 0; r < cp; ++r) {
    for (const Range& range : host_ranges(r)) {
      for (std::int64_t t = range.start; t < range.end; ++t) perm.push_back(t);
    }
  }
  return perm;
}

std::vector<std::int64_t> Dispatch::inverse_permutation() const {
  const std::vector<std::int64_t> perm = permutation();
  std::vector<std::int64_t> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[std::size_t(perm[i])] = std::int64_t(i);
  return inv;
}

std::vector<std::int64_t> Dispatch::position_ids(int rank) const {
  std::vector<std::int64_t> ids;
  for (const Range& range : host_ranges(rank)) {
    for (std::int64_t t = range.start; t < range.end; ++t) ids.push_back(t);
  }
  return ids;
}

double Dispatch::imbalance() const {
  if (rank_area.empty()) return 1.0;
  const std::int64_t total = std::accumulate(rank_area.begin(), rank_area.end(), std::int64_t{0});
  if (total == 0) return 1.0;
  const std::int64_t max = *std::max_element(rank_area.begin(), rank_area.end());
  return double(max) * double(rank_area.size()) / double(total);
}

Dispatch dispatch(const Mask& mask, const DispatchOptions& opts) {
  const int cp = opts.cp;
  const std::int64_t total = mask.total_seqlen_q();
  MAGI_CHECK(cp >= 1, "dispatch: cp ", cp, " must be at least 1");
  MAGI_CHECK(total == mask.total_seqlen_k(), "dispatch: total_seqlen_q ", total,
             " != total_seqlen_k ", mask.total_seqlen_k(), " (only self-attention is supported)");
  MAGI_CHECK(total > 0, "dispatch: the sequence is empty (total_seqlen 0)");
  MAGI_CHECK(opts.chunk_size >= 0, "dispatch: chunk_size ", opts.chunk_size,
             " is negative (0 picks it automatically)");
  if (opts.chunk_size > 0) {
    const std::int64_t c = opts.chunk_size;
    MAGI_CHECK(opts.uneven || total % (c * cp) == 0, "dispatch: total_seqlen ", total,
               " is not divisible by cp * chunk_size = ", cp, " * ", c,
               " (set uneven to allow a short last chunk)");
    MAGI_CHECK(ceil_div(total, c) >= cp, "dispatch: ", ceil_div(total, c), " chunks of ", c,
               " tokens cannot feed cp ", cp, " ranks");
    return make_dispatch(mask, cp, c, opts.algorithm);
  }
  MAGI_CHECK(opts.uneven || total % cp == 0, "dispatch: total_seqlen ", total,
             " is not divisible by cp ", cp, " (set uneven to allow uneven shards)");
  MAGI_CHECK(total >= cp, "dispatch: total_seqlen ", total, " cannot feed cp ", cp,
             " ranks a chunk each");
  // Coarsest chunking that reaches kAutoTarget under kRefined, whatever algorithm was asked
  // for, so that both algorithms see the same chunks; else the best balance seen.
  Dispatch best;
  double best_imbalance = 0;
  for (std::int64_t c : auto_chunk_sizes(total, cp)) {
    Dispatch d = make_dispatch(mask, cp, c, DispatchAlgorithm::kRefined);
    const double imb = d.imbalance();
    if (best.chunk_size == 0 || imb < best_imbalance) best = std::move(d), best_imbalance = imb;
    if (best_imbalance <= kAutoTarget) break;
  }
  if (opts.algorithm == DispatchAlgorithm::kMinHeap) {
    return make_dispatch(mask, cp, best.chunk_size, DispatchAlgorithm::kMinHeap);
  }
  return best;
}

}  // namespace magi::plan
