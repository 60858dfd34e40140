// check_agree: ranks that must hold the same object (a key's mask, plan and config) compare a
// fingerprint of it with one all_gather_v of 8 bytes per rank. Key decision: a gather, not an
// all-reduce of a hash, so that every rank sees every fingerprint and the same error names
// each group of ranks that agree; that answers in one collective round trip, instead of the
// communication timeout that a mismatched plan would hit later (blaming a "dead" rank).
#include <cstdint>
#include <map>
#include <sstream>
#include <vector>

#include "magi/comm.h"
#include "magi/error.h"

namespace magi::comm {

void check_agree(Communicator& comm, std::uint64_t fingerprint, std::string_view what) {
  const int n = comm.size();
  std::vector<std::uint64_t> all(std::size_t(n), 0);
  const std::vector<std::int64_t> counts(std::size_t(n), 1);
  // Cast moves bytes, so the 8 bytes travel unchanged whatever the dtype label says.
  comm.all_gather_v({&fingerprint, 1, 1, DType::kF64}, {all.data(), n, 1, DType::kF64}, counts)
      ->wait();
  std::map<std::uint64_t, std::vector<int>> groups;  // fingerprint -> ranks, in rank order
  for (int r = 0; r < n; ++r) groups[all[std::size_t(r)]].push_back(r);
  if (groups.size() == 1) return;
  std::ostringstream msg;
  msg << "the ranks of the cp group disagree on " << what << " (every rank must pass the same): ";
  bool first_group = true;
  for (const auto& [fp, ranks] : groups) {
    msg << (first_group ? "" : "; ") << (ranks.size() == 1 ? "rank " : "ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) msg << (i ? ", " : "") << ranks[i];
    msg << (ranks.size() == 1 ? " holds" : " hold") << " fingerprint " << std::hex << fp
        << std::dec;
    first_group = false;
  }
  msg << " (this is rank " << comm.rank() << ")";
  MAGI_CHECK(false, msg.str());
}

std::uint64_t fingerprint(std::span<const std::byte> bytes, std::uint64_t seed) {
  // FNV-1a, 64 bit: the same on every platform and process (unlike std::hash).
  std::uint64_t h = 14695981039346656037ull ^ seed;
  for (const std::byte b : bytes) h = (h ^ std::uint64_t(b)) * 1099511628211ull;
  return h;
}

}  // namespace magi::comm
