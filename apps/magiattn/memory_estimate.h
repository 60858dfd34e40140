// Memory the commands will allocate, estimated from the sizes alone and checked against what
// the host has left before anything large is allocated or built: `run --seqlen 1e12` used to
// fill memory for 54 s and die of std::bad_alloc, where it now refuses in a millisecond. The
// estimate is arithmetic in double, so no product of flags can overflow before the check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace magi::cli {

struct MemoryEstimate {
  struct Item {
    std::string what;
    double bytes = 0;
  };
  std::vector<Item> items;  // per process
  int processes = 1;        // ranks sharing this host's memory

  double total() const;
  void add(std::string what, double bytes) { items.push_back({std::move(what), bytes}); }
};

// The tensors of `magiattn run` for one process: inputs, their fp64 copies for the oracle,
// outputs and gradients, the CPU backend's packed copies, the oracle's rows; distributed
// (cp > 1), every rank also holds its own rows and the K/V it receives.
struct RunSizes {
  double num_q = 0, num_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0, sink = 0;
  double input_bytes = 4, compute_bytes = 4;  // per element
  double check_rows = 0;
  int cp = 1;
  bool gpu = false;  // the attention runs on a GPU: no CPU backend packs on the host
};
void add_run_tensors(MemoryEstimate& e, const RunSizes& s);

// Bytes this process may still allocate: /proc/meminfo's MemAvailable (else sysconf's free
// pages), lowered to a cgroup's remaining limit when there is one. Empty when unknown.
std::optional<double> available_memory();

// Throws magi::Error when the estimate exceeds the available memory:
// "run needs about 47.7 PiB (inputs 4.5 PiB, ...) but 20.9 GiB is available; lower ...".
void require_memory(const MemoryEstimate& e, const std::string& command, const std::string& hint);

}  // namespace magi::cli
