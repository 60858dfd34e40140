// `magiattn run`'s table and JSON line (see run_command.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "checks.h"
#include "run_command.h"

namespace magi::cli {

std::string fmt(const char* format, double x) {
  char s[64];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

int num_threads(const RunFlags& f) {
  return f.threads > 0 ? f.threads : int(std::thread::hardware_concurrency());
}

namespace {

// "cpu, 16 threads" or "cuda:0 NVIDIA H200" (distributed: rank 0's device).
std::string device_text(const RunFlags& f) {
  return f.cuda ? f.device_label : "cpu, " + std::to_string(num_threads(f)) + " threads";
}

// A GPU's rate reads better in TFLOP/s, the CPU's in GFLOP/s.
std::string rate(const RunFlags& f, double flops, double s) {
  return f.cuda ? fmt("  %8.2f TFLOP/s", flops / s / 1e12)
                : fmt("  %8.2f GFLOP/s", flops / s / 1e9);
}

// Seconds, or milliseconds below one second (a GPU call takes a few).
std::string duration(double s) { return s >= 1 ? fmt("%.3f s", s) : fmt("%.3f ms", s * 1e3); }

std::string bars(const Result& r) {
  if (r.grad_bar == r.bar) return fmt("%.0e", r.bar);
  return fmt("%.0e (out, lse), ", r.bar) + fmt("%.0e (dq, dk, dv)", r.grad_bar);
}

}  // namespace

void print_table(const RunFlags& f, const NamedMask& m, const Result& r) {
  print_mask_summary(std::cout, m);
  std::cout << "problem     Hq " << f.heads_q << ", Hkv " << f.heads_kv << ", D " << f.head_dim
            << ", " << f.dtype << ", " << device_text(f)
            << (f.softcap > 0 ? ", softcap " + fmt("%g", f.softcap) : "")
            << (f.sink > 0 ? ", sink " + std::to_string(f.sink) : "") << "\n"
            << "forward     " << duration(r.fwd_s) << rate(f, r.fwd_flops, r.fwd_s) << "\n"
            << "backward    " << duration(r.bwd_s) << rate(f, 2.5 * r.fwd_flops, r.bwd_s)
            << "\n"
            << "checked     " << r.num_q_checked << " q rows, " << r.num_k_checked
            << " k rows against the fp64 oracle, bar " << bars(r) << "\n";
  for (const auto& [name, e] : r.errors) {
    std::cout << "error " << name << std::string(6 - name.size(), ' ')
              << (e ? fmt("%.2e", *e) : "not checked (no row within the oracle's budget)") << "\n";
  }
  if (f.sink > 0) std::cout << "            (dsink is not checked: the sampled oracle has none)\n";
  if (!r.ranks.empty()) {
    std::cout << "ranks       " << r.ranks.size() << " ("
              << (f.comm_used == "nccl" ? "NCCL" : "MPI")
              << (f.cuda && f.comm_used != "nccl" ? " staging GPU rows through the host" : "")
              << "; bytes: K/V rows the plan's forward casts move, in the input dtype; "
                 "backward returns as many dK/dV rows)\n"
              << "            (wait: time blocked on communication; comm: the same communication "
                 "alone, no compute; hidden = 1 - wait/comm)\n"
              << "rank    tokens          area   forward  backward     bytes in    bytes out"
                 "  fwd wait/comm  hidden  bwd wait/comm  hidden   (times in "
              << (f.cuda ? "ms" : "s") << ")\n";
    const double unit = f.cuda ? 1e3 : 1;
    std::size_t slowest = 0;
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      const auto& l = r.ranks[i];
      if (l.fwd_s + l.bwd_s > r.ranks[slowest].fwd_s + r.ranks[slowest].bwd_s) slowest = i;
      char line[256];
      std::snprintf(line, sizeof line,
                    "%-4zu %9lld %13lld %10.3f %9.3f %12s %12s  %6.3f/%6.3f  %5.1f%%  "
                    "%6.3f/%6.3f  %5.1f%%\n",
                    i, static_cast<long long>(l.tokens), static_cast<long long>(l.area),
                    unit * l.fwd_s, unit * l.bwd_s, readable_bytes(l.bytes_in).c_str(),
                    readable_bytes(l.bytes_out).c_str(), unit * l.fwd_wait_s,
                    unit * l.fwd_comm_s, 100 * l.fwd_hidden(), unit * l.bwd_wait_s,
                    unit * l.bwd_comm_s, 100 * l.bwd_hidden());
      std::cout << line;
    }
    std::cout << "slowest     rank " << slowest << ", "
              << duration(r.ranks[slowest].fwd_s + r.ranks[slowest].bwd_s)
              << " (forward + backward); slowest forward " << duration(r.fwd_s)
              << ", slowest backward " << duration(r.bwd_s) << "\n";
  }
  std::cout << "result      " << (r.pass ? "PASS" : "FAIL") << "\n";
}

void print_json(const RunFlags& f, const NamedMask& m, const Result& r) {
  nlohmann::ordered_json j;
  j["mask"] = m.name;
  j["tokens_q"] = m.mask.total_seqlen_q();
  j["tokens_k"] = m.mask.total_seqlen_k();
  j["slices"] = m.mask.size();
  j["area"] = m.mask.area();
  j["sparsity"] = m.mask.sparsity();
  j["heads_q"] = f.heads_q;
  j["heads_kv"] = f.heads_kv;
  j["head_dim"] = f.head_dim;
  j["dtype"] = f.dtype;
  j["device"] = f.cuda ? f.device_label : "cpu";
  if (!f.cuda) j["threads"] = num_threads(f);
  j["softcap"] = f.softcap;
  j["sink"] = f.sink;
  j["fwd_s"] = r.fwd_s;
  j["fwd_gflops"] = r.fwd_flops / r.fwd_s / 1e9;
  j["bwd_s"] = r.bwd_s;
  j["bwd_gflops"] = 2.5 * r.fwd_flops / r.bwd_s / 1e9;
  for (const auto& [name, e] : r.errors) j["rel_error"][name] = e ? nlohmann::json(*e) : nullptr;
  j["bar"] = r.bar;
  j["grad_bar"] = r.grad_bar;
  j["checked_q_rows"] = r.num_q_checked;
  j["checked_k_rows"] = r.num_k_checked;
  if (!r.ranks.empty()) {
    j["ranks"] = r.ranks.size();
    j["comm"] = f.comm_used;
    for (const auto& l : r.ranks)
      j["per_rank"].push_back({{"tokens", l.tokens},
                               {"area", l.area},
                               {"fwd_s", l.fwd_s},
                               {"bwd_s", l.bwd_s},
                               {"bytes_in", l.bytes_in},
                               {"bytes_out", l.bytes_out},
                               {"fwd_wait_s", l.fwd_wait_s},
                               {"fwd_comm_s", l.fwd_comm_s},
                               {"fwd_hidden", l.fwd_hidden()},
                               {"bwd_wait_s", l.bwd_wait_s},
                               {"bwd_comm_s", l.bwd_comm_s},
                               {"bwd_hidden", l.bwd_hidden()}});
  }
  j["pass"] = r.pass;
  std::cout << j.dump() << "\n";
}

}  // namespace magi::cli
