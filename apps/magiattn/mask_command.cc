// `magiattn mask`: print a mask's slices and summary and draw it in the terminal. Each
// character covers a block of cells and shows whether none, some or all of them are visible;
// the count comes from Mask::area over the block, so the picture is exact at any size.
#include <algorithm>
#include <iostream>
#include <memory>

#include "checks.h"
#include "magi/mask_json.h"
#include "mask_flags.h"

namespace magi::cli {
namespace {

struct MaskCommandFlags {
  MaskFlags mask;
  std::int64_t max_slices = 16;
  std::int64_t width = 64;   // characters per line (key axis)
  std::int64_t height = 32;  // lines (query axis); terminal cells are about 2:1
  std::string save;
};

// Cell block [r, c] of a rows x cols picture: ' ' empty, '.' partial, '#' full.
void draw(std::ostream& os, const Mask& mask, std::int64_t rows, std::int64_t cols) {
  const std::int64_t nq = mask.total_seqlen_q(), nk = mask.total_seqlen_k();
  rows = std::clamp<std::int64_t>(rows, 1, std::max<std::int64_t>(1, nq));
  cols = std::clamp<std::int64_t>(cols, 1, std::max<std::int64_t>(1, nk));
  const std::string border = "+" + std::string(std::size_t(cols), '-') + "+\n";
  os << border;
  for (std::int64_t r = 0; r < rows; ++r) {
    const Range q_rows{r * nq / rows, (r + 1) * nq / rows};
    os << '|';
    for (std::int64_t c = 0; c < cols; ++c) {
      const Range k_cols{c * nk / cols, (c + 1) * nk / cols};
      const std::int64_t visible = mask.area(q_rows, k_cols);
      os << (visible == 0 ? ' ' : visible == q_rows.size() * k_cols.size() ? '#' : '.');
    }
    os << "|\n";
  }
  os << border << "one character ~ " << grouped((nq + rows - 1) / rows) << " q x "
     << grouped((nk + cols - 1) / cols) << " k; '#' all visible, '.' some, ' ' none\n";
}

int run_mask(const MaskCommandFlags& flags) {
  const NamedMask m = make_mask(flags.mask);
  print_mask_summary(std::cout, m);
  const auto& slices = m.mask.slices();
  const std::size_t shown = std::min<std::size_t>(slices.size(), std::size_t(flags.max_slices));
  for (std::size_t i = 0; i < shown; ++i) {
    std::cout << "  " << i << ": " << to_string(slices[i]) << "\n";
  }
  if (shown < slices.size()) {
    std::cout << "  ... " << slices.size() - shown << " more (--max-slices)\n";
  }
  draw(std::cout, m.mask, flags.height, flags.width);
  if (!flags.save.empty()) {
    save_mask(m.mask, flags.save);
    std::cout << "saved " << flags.save << "\n";
  }
  return 0;
}

}  // namespace

Command add_mask_command(CLI::App& parent) {
  auto flags = std::make_shared<MaskCommandFlags>();
  CLI::App* cmd = parent.add_subcommand("mask", "print, draw and save a mask");
  add_mask_flags(*cmd, flags->mask);
  cmd->add_option("--max-slices", flags->max_slices, "slices to list")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--width", flags->width, "drawing width in characters")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--height", flags->height, "drawing height in lines")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--save", flags->save, "write the mask as JSON to this file");
  return {cmd, [flags] { return run_mask(*flags); }};
}

}  // namespace magi::cli
