// `magiattn run`'s flags and result, and the two ways it prints a result: the table and one
// JSON line. Distributed runs add one line per rank (rank 0's view of every rank's times).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mask_flags.h"

namespace magi::cli {

struct RunFlags {
  MaskFlags mask;
  std::int64_t heads_q = 8, heads_kv = 2, head_dim = 128;
  std::string dtype = "fp32";
  int threads = 0;
  double softcap = 0;
  std::int64_t sink = 0;
  std::int64_t check_rows = 64;
  bool json = false;
  double comm_timeout_s = 300;  // a dead or stuck peer becomes an error after this long
  int ranks = 0;  // --ranks: expect this many MPI ranks (0: run distributed only under mpirun)
  bool uneven = false;          // distributed: let the ranks' shares differ by one chunk
  std::string device = "auto";  // --device: auto, cpu or cuda
  std::string comm = "auto";    // --comm (distributed): auto, mpi or nccl
  bool dtype_given = false, ranks_given = false;  // whether the user passed --dtype, --ranks
  // Resolved before the run (device_run.h): where it runs and, distributed, over what.
  bool cuda = false;
  int gpu = 0;                       // the CUDA device of this process
  std::string device_label = "cpu";  // "cuda:0 NVIDIA H200"
  std::string comm_used;             // "mpi" or "nccl" (distributed runs)
};

struct Result {
  double fwd_s = 0, bwd_s = 0, fwd_flops = 0;  // backward FLOPs: 2.5x forward (semantics §4)
  std::vector<std::pair<std::string, std::optional<double>>> errors;  // empty: not checked
  double bar = 0;                                                     // out, lse
  double grad_bar = 0;                                                // dq, dk, dv
  std::size_t num_q_checked = 0, num_k_checked = 0;
  bool pass = true;
  // Distributed runs only: per-rank lines (rank 0's view), fwd_s/bwd_s above are the slowest.
  // hidden: the share of the comm-alone time (casts, and in the backward the dK/dV reduces,
  // run back to back without compute) that the overlapped run did not spend blocked in waits.
  struct RankLine {
    std::int64_t tokens = 0, area = 0;
    double fwd_s = 0, bwd_s = 0, bytes_in = 0, bytes_out = 0;
    double fwd_wait_s = 0, bwd_wait_s = 0, fwd_comm_s = 0, bwd_comm_s = 0;
    static double hidden(double wait, double comm) {
      return comm > 0 ? std::clamp(1.0 - wait / comm, 0.0, 1.0) : 1.0;
    }
    double fwd_hidden() const { return hidden(fwd_wait_s, fwd_comm_s); }
    double bwd_hidden() const { return hidden(bwd_wait_s, bwd_comm_s); }
  };
  std::vector<RankLine> ranks;
};

int num_threads(const RunFlags& f);  // --threads, or the hardware's
std::string fmt(const char* format, double x);
void print_table(const RunFlags& f, const NamedMask& m, const Result& r);
void print_json(const RunFlags& f, const NamedMask& m, const Result& r);

}  // namespace magi::cli
