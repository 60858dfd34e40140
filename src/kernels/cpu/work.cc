// Tile work lists. Building them is O(slices + tiles touched); the cost of a tile is its
// visible area from the mask's O(1) counts plus 4096 cells per slice visit (a quarter of a
// 256 x 64 tile, for its packing, classification and masking), so that tiles made of many
// tiny slices still sort as heavy as they are.
#include "work.h"

#include <algorithm>

#include "isa.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {
namespace {

constexpr double kSliceOverhead = 4096;

std::vector<TileWork> make_tiles(std::int64_t total, std::int64_t block) {
  std::vector<TileWork> tiles(std::size_t((total + block - 1) / block));
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const std::int64_t start = std::int64_t(i) * block;
    tiles[i].rows = Range{start, std::min(total, start + block)};
  }
  return tiles;
}

}  // namespace

std::vector<TileWork> query_tiles(const Mask& mask, std::int64_t block) {
  std::vector<TileWork> tiles = make_tiles(mask.total_seqlen_q(), block);
  for (std::size_t s_idx = 0; s_idx < mask.size(); ++s_idx) {
    const Slice& s = mask[s_idx];
    if (s.q_range.empty()) continue;
    for (std::int64_t t = s.q_range.start / block; t * block < s.q_range.end; ++t) {
      TileWork& tile = tiles[std::size_t(t)];
      const std::int64_t cells = area(s, tile.rows);
      if (cells == 0) continue;
      tile.slices.push_back(std::int32_t(s_idx));
      tile.cost += double(cells) + kSliceOverhead;
    }
  }
  return tiles;
}

std::vector<TileWork> key_tiles(const Mask& mask, std::int64_t block) {
  std::vector<TileWork> tiles = make_tiles(mask.total_seqlen_k(), block);
  for (std::size_t s_idx = 0; s_idx < mask.size(); ++s_idx) {
    const Slice& s = mask[s_idx];
    if (s.k_range.empty()) continue;
    for (std::int64_t t = s.k_range.start / block; t * block < s.k_range.end; ++t) {
      TileWork& tile = tiles[std::size_t(t)];
      const std::int64_t cells = area(s, s.q_range, tile.rows);
      if (cells == 0) continue;
      tile.slices.push_back(std::int32_t(s_idx));
      tile.cost += double(cells) + kSliceOverhead;
    }
  }
  return tiles;
}

std::vector<Task> heavy_first(const std::vector<TileWork>& tiles, std::int64_t num_heads) {
  std::vector<Task> tasks;
  tasks.reserve(tiles.size() * std::size_t(num_heads));
  for (std::size_t t = 0; t < tiles.size(); ++t)
    for (std::int64_t h = 0; h < num_heads; ++h)
      tasks.push_back(Task{std::int32_t(t), std::int32_t(h)});
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return tiles[std::size_t(a.tile_idx)].cost > tiles[std::size_t(b.tile_idx)].cost;
  });
  return tasks;
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
