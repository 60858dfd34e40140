// Memory estimates for the commands (see memory_estimate.h). The figures follow the
// allocations in run_command.cc, src/kernels/cpu (packs) and tests/support/oracle.cc; they
// are upper-ish bounds ("about"), since refusing a run that would fit is the smaller harm
// than a bad_alloc after a minute, and --no-memory-check overrides them.
#include "memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "checks.h"
#include "magi/error.h"

namespace magi::cli {
namespace {

double round_up(double x, double m) { return std::ceil(x / m) * m; }

// The CPU backward's packed copies (scale * Q and dO rows, K rows, K^T and V^T per 64-key
// tile; rows padded to the vector width, at most 16 elements) plus its lse and Delta. The
// forward's packs (K^T and V) are smaller and freed before the backward starts.
double backend_packs(double nq, double nk, const RunSizes& s) {
  const double width = round_up(s.head_dim, 16);
  return s.compute_bytes * (2 * nq * s.heads_q * width + nk * s.heads_kv * width +
                            2 * round_up(nk, 64) * s.heads_kv * s.head_dim +
                            2 * nq * s.heads_q);
}

// q, k, v, dout in the input dtype; out, lse, dq, dk, dv in the compute dtype.
double attn_buffers(double nq, double nk, const RunSizes& s) {
  const double q = nq * s.heads_q * s.head_dim, kv = nk * s.heads_kv * s.head_dim;
  return s.input_bytes * (2 * q + 2 * kv) + s.compute_bytes * (2 * q + nq * s.heads_q + 2 * kv);
}

std::optional<double> read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

// A cgroup's limit minus its usage (v2, then v1); v1 reports "no limit" as about 2^63.
std::optional<double> cgroup_left() {
  const auto left = [](const char* limit_path, const char* usage_path) -> std::optional<double> {
    const auto limit = read_number(limit_path), usage = read_number(usage_path);
    if (!limit || !usage || *limit >= 0x1p60) return std::nullopt;
    return std::max(0.0, *limit - *usage);
  };
  if (auto v2 = left("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")) return v2;
  return left("/sys/fs/cgroup/memory/memory.limit_in_bytes",
              "/sys/fs/cgroup/memory/memory.usage_in_bytes");
}

}  // namespace

double MemoryEstimate::total() const {
  double bytes = 0;
  for (const Item& i : items) bytes += i.bytes;
  return bytes * processes;
}

void add_run_tensors(MemoryEstimate& e, const RunSizes& s) {
  const double q = s.num_q * s.heads_q * s.head_dim, kv = s.num_k * s.heads_kv * s.head_dim;
  const double sink = s.sink * s.heads_q;
  e.add("inputs", s.input_bytes * (2 * q + 2 * kv));
  e.add("their fp64 copies", 8 * (2 * q + 2 * kv + sink));
  e.add("outputs and gradients",
        s.compute_bytes * (2 * q + s.num_q * s.heads_q + 2 * kv + 2 * sink));
  const double q_rows = std::min(s.check_rows, s.num_q);
  const double k_rows = std::min(std::floor(s.check_rows / 4), s.num_k);
  // Reference rows, and for dK/dV the lse and Delta of every query row (and a flag per row).
  e.add("oracle rows", 8 * (q_rows * (2 * s.heads_q * s.head_dim + s.heads_q) +
                       k_rows * 2 * s.heads_kv * s.head_dim) +
                      (k_rows > 0 ? s.num_q * (1 + 16 * s.heads_q) : 0));
  if (s.cp <= 1) {
    if (!s.gpu) e.add("CPU backend packs", backend_packs(s.num_q, s.num_k, s));
    return;
  }
  // Each rank also holds its own rows and, at most, every other rank's K/V (in the input
  // dtype) with as many dK/dV partials; the backend then packs its rows against those.
  const double local = std::ceil(s.num_q / s.cp);
  e.add("this rank's rows", attn_buffers(local, local, s));
  e.add("received K/V and partial dK/dV",
        (2 * s.input_bytes + 2 * s.compute_bytes) * kv);
  if (!s.gpu) e.add("CPU backend packs", backend_packs(local, s.num_k, s));
  // GPU rows through the MPI communicator are staged in host copies about the size of the
  // received K/V above: counted there.
  e.add("MPI", 64.0 * (1 << 20));  // measured: 68 MiB above the rest at np 2, 32k tokens
}

std::optional<double> available_memory() {
  std::optional<double> bytes = meminfo_available();
  if (!bytes) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) bytes = double(pages) * double(page);
  }
  if (const auto cgroup = cgroup_left()) bytes = bytes ? std::min(*bytes, *cgroup) : *cgroup;
  return bytes;
}

void require_memory(const MemoryEstimate& e, const std::string& command,
                    const std::string& hint) {
  const std::optional<double> available = available_memory();
  const double total = e.total();
  if (!available || total <= *available) return;
  std::ostringstream os;
  os << command << " needs about " << readable_bytes(total) << " of memory (";
  if (e.processes > 1) {
    os << e.processes << " ranks on this host x " << readable_bytes(total / e.processes)
       << ": ";
  }
  bool first = true;
  for (const auto& item : e.items) {  // the parts above 1% of the whole, in allocation order
    if (item.bytes * e.processes < 0.01 * total) continue;
    os << (first ? "" : ", ") << item.what << " " << readable_bytes(item.bytes);
    first = false;
  }
  os << ") but " << readable_bytes(*available) << " is available; " << hint
     << " (or pass --no-memory-check)";
  MAGI_FAIL(os.str());
}

}  // namespace magi::cli
