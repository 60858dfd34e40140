// `magiattn run`: one forward and one backward through the public API on seeded normal
// inputs, timed, then checked against the fp64 oracle on sampled rows. The oracle is scalar
// fp64 and must recompute every row that sees a checked key, so key rows are chosen within a
// budget: the default 16k-token check then takes seconds where a full one takes minutes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "magi/attention.h"
#include "magi/error.h"
#include "mask_flags.h"
#include "oracle.h"

#ifdef MAGI_CLI_MPI  // distributed `run` under mpirun: the runtime over the MPI communicator
#include <mpi.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "magi/plan.h"
#include "magi/runtime.h"
#include "mpi_communicator.h"
#endif

namespace magi::cli {
namespace {

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
};

bool g_quiet = false;  // ranks other than 0 print nothing

// fp64: SPEC §5's bar for the CPU backend. fp32, bf16, fp16: inputs are rounded to their
// dtype once and the oracle reads the same rounded values, while the CPU backend widens them
// and computes and stores in fp32, so only fp32 arithmetic is left and the fp32 bar applies.
double error_bar(DType t) { return t == DType::kF64 ? 1e-12 : 1e-5; }

// Multiply-adds (cells x heads x head dim) the oracle may spend recomputing rows for the dk/dv
// check: about 5 s of its fp64 scalar loops on 2 cores (4M cells at Hq 8, D 128).
constexpr std::int64_t kOracleKeyBudget = std::int64_t(1) << 32;

// A contiguous host buffer of one dtype; set() rounds to the dtype and returns what it stored.
class Buffer {
 public:
  Buffer(DType dtype, std::int64_t numel)
      : dtype_(dtype), bytes_(std::size_t(numel) * std::size_t(dtype_size(dtype))) {}

  TensorView view(std::initializer_list<std::int64_t> shape) {
    return make_view(bytes_.data(), dtype_, shape);
  }

  double get(std::size_t i) const {
    switch (dtype_) {
      case DType::kF64:
        return load<double>(i);
      case DType::kF32:
        return load<float>(i);
      case DType::kBF16:
        return to_float(load<BF16>(i));
      case DType::kF16:
        return to_float(load<F16>(i));
    }
    return 0;
  }

  double set(std::size_t i, double x) {
    switch (dtype_) {
      case DType::kF64:
        store(i, x);
        break;
      case DType::kF32:
        store(i, float(x));
        break;
      case DType::kBF16:
        store(i, to_bf16(float(x)));
        break;
      case DType::kF16:
        store(i, to_f16(float(x)));
        break;
    }
    return get(i);
  }

  std::size_t numel() const { return bytes_.size() / std::size_t(dtype_size(dtype_)); }

 private:
  template <typename T>
  T load(std::size_t i) const {
    T x;
    std::memcpy(&x, bytes_.data() + i * sizeof(T), sizeof(T));
    return x;
  }
  template <typename T>
  void store(std::size_t i, T x) {
    std::memcpy(bytes_.data() + i * sizeof(T), &x, sizeof(T));
  }

  DType dtype_;
  std::vector<std::byte> bytes_;
};

// Standard normals by Box-Muller over the top 53 bits of mt19937_64: the same inputs for a
// seed on every standard library (std::normal_distribution is not portable).
std::vector<double> fill_normal(Buffer& buf, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto unit = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<double> exact(buf.numel());
  for (std::size_t i = 0; i < exact.size(); i += 2) {
    const double radius = std::sqrt(-2 * std::log(1 - unit()));  // 1 - u in (0, 1]
    const double angle = 2 * std::numbers::pi * unit();
    exact[i] = buf.set(i, radius * std::cos(angle));
    if (i + 1 < exact.size()) exact[i + 1] = buf.set(i + 1, radius * std::sin(angle));
  }
  return exact;
}

// The tensors of one forward + backward: inputs in the run's dtype, outputs in the compute
// type (so the check measures the kernels, not a final rounding). Used for the whole problem
// and, distributed, for each rank's local rows.
struct AttnBuffers {
  std::int64_t nq, nk, hq, hkv, d;
  Buffer q, k, v, dout, out, lse, dq, dk, dv;

  AttnBuffers(DType in, DType compute, std::int64_t nq_, std::int64_t nk_, std::int64_t hq_,
              std::int64_t hkv_, std::int64_t d_)
      : nq(nq_), nk(nk_), hq(hq_), hkv(hkv_), d(d_),
        q(in, nq * hq * d), k(in, nk * hkv * d), v(in, nk * hkv * d), dout(in, nq * hq * d),
        out(compute, nq * hq * d), lse(compute, nq * hq), dq(compute, nq * hq * d),
        dk(compute, nk * hkv * d), dv(compute, nk * hkv * d) {}

  FwdArgs fwd(std::optional<TensorView> sink) {
    return FwdArgs{q.view({nq, hq, d}), k.view({nk, hkv, d}), v.view({nk, hkv, d}),
                   out.view({nq, hq, d}), lse.view({nq, hq}), sink, std::nullopt};
  }
  BwdArgs bwd(std::optional<TensorView> sink, std::optional<TensorView> dsink) {
    return BwdArgs{dout.view({nq, hq, d}), q.view({nq, hq, d}),   k.view({nk, hkv, d}),
                   v.view({nk, hkv, d}),   out.view({nq, hq, d}), lse.view({nq, hq}),
                   dq.view({nq, hq, d}),   dk.view({nk, hkv, d}), dv.view({nk, hkv, d}),
                   sink,                   dsink};
  }
};

// `count` distinct sorted query rows including the first and the last.
std::vector<std::int64_t> pick_query_rows(std::int64_t n, std::int64_t count,
                                          std::mt19937_64& rng) {
  std::set<std::int64_t> rows;
  if (count >= n) {
    for (std::int64_t r = 0; r < n; ++r) rows.insert(r);
  } else if (count > 0) {
    rows = {0, n - 1};
    while (std::int64_t(rows.size()) < count) rows.insert(std::int64_t(rng() % std::uint64_t(n)));
  }
  return {rows.begin(), rows.end()};
}

// Visible cells of the query rows that see key j: what the oracle recomputes for its dk/dv.
std::int64_t oracle_cells_for_key(const Mask& mask, std::int64_t j) {
  std::int64_t cells = 0;
  for (const auto& s : mask.slices()) {
    if (!s.k_range.contains(j)) continue;
    const Band band = band_of(s);  // (q, j) visible iff j - hi <= q <= j - lo
    cells += mask.area(s.q_range.intersect(Range{j - band.hi, j - band.lo + 1}));
  }
  return cells;
}

// Key rows for the dk/dv check: the last, the first, then random ones, each accepted only
// while the oracle's recomputed cells stay within `budget`. The default 16k document-packed
// mask affords a dozen keys; a full 16k mask none (2.7e8 cells behind every key).
std::vector<std::int64_t> pick_key_rows(const Mask& mask, std::int64_t count, std::int64_t budget,
                                        std::mt19937_64& rng) {
  const std::int64_t nk = mask.total_seqlen_k();
  std::set<std::int64_t> rows;
  std::int64_t spent = 0;
  for (std::int64_t attempt = 0; nk > 0 && attempt < 4 * count && std::int64_t(rows.size()) < count;
       ++attempt) {
    const std::int64_t j = attempt == 0   ? nk - 1
                           : attempt == 1 ? 0
                                          : std::int64_t(rng() % std::uint64_t(nk));
    if (rows.contains(j)) continue;
    const std::int64_t cells = oracle_cells_for_key(mask, j);
    if (spent + cells > budget) continue;
    spent += cells;
    rows.insert(j);
  }
  return {rows.begin(), rows.end()};
}

std::vector<double> gather_rows(const Buffer& b, const std::vector<std::int64_t>& rows,
                                std::int64_t row_len) {
  std::vector<double> out;
  out.reserve(rows.size() * std::size_t(row_len));
  for (auto r : rows) {
    for (std::int64_t i = 0; i < row_len; ++i) out.push_back(b.get(std::size_t(r * row_len + i)));
  }
  return out;
}

template <typename F>
double timed(const std::string& what, F&& f) {
  if (!g_quiet) std::cerr << "[magiattn] " << what << "..." << std::flush;
  const auto start = std::chrono::steady_clock::now();
  try {
    f();
  } catch (...) {
    if (!g_quiet) std::cerr << " failed\n";  // end the progress line before the error is printed
    throw;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[32];
  std::snprintf(line, sizeof line, " %.2f s\n", s);
  if (!g_quiet) std::cerr << line;
  return s;
}

std::string fmt(const char* format, double x) {
  char s[64];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

struct Result {
  double fwd_s = 0, bwd_s = 0, fwd_flops = 0;  // backward FLOPs: 2.5x forward (SPEC §4)
  std::vector<std::pair<std::string, std::optional<double>>> errors;  // empty: not checked
  double bar = 0;
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

int num_threads(const RunFlags& f) {
  return f.threads > 0 ? f.threads : int(std::thread::hardware_concurrency());
}

void print_table(const RunFlags& f, const NamedMask& m, const Result& r) {
  print_mask_summary(std::cout, m);
  std::cout << "problem     Hq " << f.heads_q << ", Hkv " << f.heads_kv << ", D " << f.head_dim
            << ", " << f.dtype << ", cpu, " << num_threads(f) << " threads"
            << (f.softcap > 0 ? ", softcap " + fmt("%g", f.softcap) : "")
            << (f.sink > 0 ? ", sink " + std::to_string(f.sink) : "") << "\n"
            << "forward     " << fmt("%.3f s", r.fwd_s)
            << fmt("  %8.2f GFLOP/s", r.fwd_flops / r.fwd_s / 1e9) << "\n"
            << "backward    " << fmt("%.3f s", r.bwd_s)
            << fmt("  %8.2f GFLOP/s", 2.5 * r.fwd_flops / r.bwd_s / 1e9) << "\n"
            << "checked     " << r.num_q_checked << " q rows, " << r.num_k_checked
            << " k rows against the fp64 oracle, bar " << fmt("%.0e", r.bar) << "\n";
  for (const auto& [name, e] : r.errors) {
    std::cout << "error " << name << std::string(6 - name.size(), ' ')
              << (e ? fmt("%.2e", *e) : "not checked (no row within the oracle's budget)") << "\n";
  }
  if (f.sink > 0) std::cout << "            (dsink is not checked: the sampled oracle has none)\n";
  if (!r.ranks.empty()) {
    std::cout << "ranks       " << r.ranks.size()
              << " (MPI; bytes: K/V rows the plan's forward casts move, in the input dtype; "
                 "backward returns as many dK/dV rows)\n"
              << "            (wait: time blocked on communication; comm: the same communication "
                 "alone, no compute; hidden = 1 - wait/comm)\n"
              << "rank    tokens          area   forward  backward     bytes in    bytes out"
                 "  fwd wait/comm  hidden  bwd wait/comm  hidden\n";
    std::size_t slowest = 0;
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      const auto& l = r.ranks[i];
      if (l.fwd_s + l.bwd_s > r.ranks[slowest].fwd_s + r.ranks[slowest].bwd_s) slowest = i;
      char line[256];
      std::snprintf(line, sizeof line,
                    "%-4zu %9lld %13lld %8.3f s %8.3f s %12.0f %12.0f  %6.3f/%6.3f  %5.1f%%  "
                    "%6.3f/%6.3f  %5.1f%%\n",
                    i, static_cast<long long>(l.tokens), static_cast<long long>(l.area), l.fwd_s,
                    l.bwd_s, l.bytes_in, l.bytes_out, l.fwd_wait_s, l.fwd_comm_s,
                    100 * l.fwd_hidden(), l.bwd_wait_s, l.bwd_comm_s, 100 * l.bwd_hidden());
      std::cout << line;
    }
    std::cout << "slowest     rank " << slowest << ", "
              << fmt("%.3f s", r.ranks[slowest].fwd_s + r.ranks[slowest].bwd_s)
              << " (forward + backward); slowest forward " << fmt("%.3f s", r.fwd_s)
              << ", slowest backward " << fmt("%.3f s", r.bwd_s) << "\n";
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
  j["threads"] = num_threads(f);
  j["softcap"] = f.softcap;
  j["sink"] = f.sink;
  j["fwd_s"] = r.fwd_s;
  j["fwd_gflops"] = r.fwd_flops / r.fwd_s / 1e9;
  j["bwd_s"] = r.bwd_s;
  j["bwd_gflops"] = 2.5 * r.fwd_flops / r.bwd_s / 1e9;
  for (const auto& [name, e] : r.errors) j["rel_error"][name] = e ? nlohmann::json(*e) : nullptr;
  j["bar"] = r.bar;
  j["checked_q_rows"] = r.num_q_checked;
  j["checked_k_rows"] = r.num_k_checked;
  if (!r.ranks.empty()) {
    j["ranks"] = r.ranks.size();
    for (const auto& l : r.ranks)
      j["per_rank"].push_back({{"tokens", l.tokens}, {"area", l.area}, {"fwd_s", l.fwd_s},
                               {"bwd_s", l.bwd_s}, {"bytes_in", l.bytes_in},
                               {"bytes_out", l.bytes_out}, {"fwd_wait_s", l.fwd_wait_s},
                               {"fwd_comm_s", l.fwd_comm_s}, {"fwd_hidden", l.fwd_hidden()},
                               {"bwd_wait_s", l.bwd_wait_s}, {"bwd_comm_s", l.bwd_comm_s},
                               {"bwd_hidden", l.bwd_hidden()}});
  }
  j["pass"] = r.pass;
  std::cout << j.dump() << "\n";
}

#ifdef MAGI_CLI_MPI
// Under mpirun (Open MPI, MPICH/PMI, Slurm) or with --ranks: MPI is initialised only then.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

// `magiattn run --ranks N` outside mpirun: replace this process by `mpiexec -n N magiattn
// <the same arguments>` (Open MPI may oversubscribe the cores and run as root, as the tests
// do). Returns only on failure.
[[noreturn]] void launch_ranks(int ranks) {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(cmdline)), {});
  std::vector<std::string> args;
  for (std::size_t i = 0; i < all.size();) {
    const std::size_t end = all.find('\0', i);
    args.push_back(all.substr(i, end - i));
    i = end == std::string::npos ? all.size() : end + 1;
  }
  MAGI_CHECK(!args.empty(), "--ranks ", ranks, ": cannot read this process's arguments");
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  MAGI_CHECK(len > 0, "--ranks ", ranks, ": cannot find this executable's path");
  self[len] = '\0';
  std::vector<std::string> cmd{MAGI_MPIEXEC, "-n", std::to_string(ranks), self};
  cmd.insert(cmd.end(), args.begin() + 1, args.end());
  std::vector<char*> argv;
  for (std::string& a : cmd) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::cout.flush();
  execv(MAGI_MPIEXEC, argv.data());
  MAGI_FAIL("--ranks ", ranks, ": could not start ", MAGI_MPIEXEC, ": ", std::strerror(errno));
}

// MPI_Init on construction, MPI_Finalize on destruction (after the communicator is gone),
// except after a communication failure: MPI_Finalize would wait for the dead or stuck peer,
// so the rank skips it, main prints the error and exits 1, and mpirun ends the job.
struct MpiSession {
  bool comm_failed = false;
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;  // MULTIPLE: the communicator's progress thread overlaps transfers
    if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !comm_failed) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Rows a rank receives / sends in the plan's forward casts (as DistPlan::summary counts them).
std::pair<std::int64_t, std::int64_t> cast_rows(const plan::RankPlan& rp) {
  std::int64_t in = 0, out = 0;
  for (const plan::Stage& st : rp.stages) {
    for (std::int64_t s : st.cast.output_split_sizes) in += s;
    for (std::size_t i = 0; i < st.cast.input_split_sizes.size(); ++i)
      out += st.cast.input_split_sizes[i] * std::int64_t(st.cast.dst_ranks[i].size());
  }
  return {in, out};
}
#endif

int run_attention(RunFlags f) {
  const NamedMask m = make_mask(f.mask);
#ifdef MAGI_CLI_MPI
  std::optional<MpiSession> mpi_session;
  std::unique_ptr<comm::mpi::MpiCommunicator> world;
  if (f.ranks > 1 && !launched_by_mpi()) launch_ranks(f.ranks);
  struct SkipFinalizeIfBroken {  // destroyed before world and the session
    std::optional<MpiSession>& session;
    const std::unique_ptr<comm::mpi::MpiCommunicator>& world;
    ~SkipFinalizeIfBroken() {
      if (session && world && world->broken()) session->comm_failed = true;
    }
  } skip_finalize_if_broken{mpi_session, world};
  if (f.ranks > 0 || launched_by_mpi()) {
    mpi_session.emplace();
    world = std::make_unique<comm::mpi::MpiCommunicator>();
    world->set_timeout(std::chrono::milliseconds(std::int64_t(f.comm_timeout_s * 1000)));
    MAGI_CHECK(f.ranks == 0 || f.ranks == world->size(), "--ranks ", f.ranks, ": running on ",
               world->size(), " MPI ranks");
    g_quiet = world->rank() != 0;
    // Ranks share the host: split its cores unless --threads says otherwise.
    if (f.threads == 0)
      f.threads = std::max(1, int(std::thread::hardware_concurrency()) / world->size());
  }
#else
  MAGI_CHECK(f.ranks == 0, "--ranks: this magiattn was built without MPI");
#endif
  const DType dtype = dtype_from_name(f.dtype);
  const DType compute = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  const std::int64_t nq = m.mask.total_seqlen_q(), nk = m.mask.total_seqlen_k();
  const std::int64_t hq = f.heads_q, hkv = f.heads_kv, d = f.head_dim, ns = f.sink;

  oracle::Problem p;
  p.num_q = nq, p.num_k = nk, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
  p.softcap = f.softcap;
  p.sink_len = ns;
  AttnBuffers g(dtype, compute, nq, nk, hq, hkv, d);  // the whole problem
  Buffer sink(compute, ns * hq), dsink(compute, ns * hq);
  timed("inputs", [&] {
    const std::uint64_t s = f.mask.spec.seed * 8;  // one stream per tensor
    p.q = fill_normal(g.q, s + 1), p.k = fill_normal(g.k, s + 2), p.v = fill_normal(g.v, s + 3);
    p.dout = fill_normal(g.dout, s + 4), p.sink = fill_normal(sink, s + 5);
  });
  AttnOptions opts;
  opts.softcap = f.softcap;
  opts.num_threads = f.threads;
  std::optional<TensorView> sink_v, dsink_v;
  if (ns > 0) sink_v = sink.view({ns, hq}), dsink_v = dsink.view({ns, hq});
  const FwdArgs fa = g.fwd(sink_v);
  const BwdArgs ba = g.bwd(sink_v, dsink_v);
  double fwd_s = 0, bwd_s = 0;
  std::vector<Result::RankLine> rank_lines;
#ifdef MAGI_CLI_MPI
  if (world) {
    comm::Communicator& comm = *world;
    const int rank = comm.rank(), cp = comm.size();
    plan::PlanOptions po;
    po.dispatch.cp = cp;
    plan::DistPlan dp;
    timed("plan for " + std::to_string(cp) + " ranks", [&] { dp = plan::make_plan(m.mask, po); });
    const std::int64_t nl = dp.dispatch.rank_tokens(rank);
    AttnBuffers l(dtype, compute, nl, nl, hq, hkv, d);  // this rank's rows
    const FwdArgs la = l.fwd(sink_v);
    const BwdArgs lb = l.bwd(sink_v, dsink_v);
    timed("dispatch", [&] {
      runtime::dispatch(dp, comm, fa.q, la.q);
      runtime::dispatch(dp, comm, fa.k, la.k);
      runtime::dispatch(dp, comm, fa.v, la.v);
      runtime::dispatch(dp, comm, ba.dout, lb.dout);
    });
    runtime::CalcStats fwd_stats, bwd_stats;
    comm.barrier();  // every rank starts the timed forward together
    const double my_fwd = timed("forward (rank 0)", [&] {
      runtime::calc_attn_forward(dp, comm, la, opts, &fwd_stats);
    });
    comm.barrier();
    const double my_bwd = timed("backward (rank 0)", [&] {
      runtime::calc_attn_backward(dp, comm, lb, opts, &bwd_stats);
    });
    comm.barrier();
    double fwd_comm = 0, bwd_comm = 0;
    timed("communication alone (fwd, bwd)", [&] {
      fwd_comm = runtime::comm_only_seconds(dp, comm, la.k, la.v, false);
      comm.barrier();
      bwd_comm = runtime::comm_only_seconds(dp, comm, la.k, la.v, true);
    });
    if (ns > 0) {  // dsink is a per-rank partial: summed like a replicated parameter's gradient
      comm.all_reduce(comm::Rows{dsink.view({ns, hq}).data, 1, ns * hq, compute},
                      comm::ReduceOp::kSum)
          ->wait();
    }
    timed("undispatch", [&] {
      runtime::undispatch(dp, comm, la.out, fa.out);
      runtime::undispatch(dp, comm, la.lse, fa.lse);
      runtime::undispatch(dp, comm, lb.dq, ba.dq);
      runtime::undispatch(dp, comm, lb.dk, ba.dk);
      runtime::undispatch(dp, comm, lb.dv, ba.dv);
    });
    // Every rank's times to every rank; the table reports the slowest.
    // Through the Communicator, not raw MPI, so a dead rank gives an error, never a hang.
    constexpr int kTimes = 6;
    std::vector<double> times(std::size_t(kTimes * cp), 0.0);
    const double mine[kTimes] = {my_fwd, my_bwd, fwd_stats.wait_s, bwd_stats.wait_s, fwd_comm,
                                 bwd_comm};
    std::copy(mine, mine + kTimes, times.begin() + kTimes * rank);
    comm.all_reduce(comm::Rows{times.data(), 1, kTimes * cp, DType::kF64}, comm::ReduceOp::kSum)
        ->wait();
    const double row_bytes = double(2 * hkv * d * dtype_size(dtype));  // one K row + one V row
    for (int r = 0; r < cp; ++r) {
      const plan::RankPlan& rp = dp.ranks[std::size_t(r)];
      Result::RankLine l;
      l.tokens = dp.dispatch.rank_tokens(r);
      l.area = rp.host_area;
      for (const plan::Stage& st : rp.stages) l.area += st.area;
      const double* t = times.data() + kTimes * r;
      l.fwd_s = t[0], l.bwd_s = t[1], l.fwd_wait_s = t[2], l.bwd_wait_s = t[3];
      l.fwd_comm_s = t[4], l.bwd_comm_s = t[5];
      const auto [in, out_rows] = cast_rows(rp);
      l.bytes_in = double(in) * row_bytes;
      l.bytes_out = double(out_rows) * row_bytes;
      fwd_s = std::max(fwd_s, l.fwd_s);
      bwd_s = std::max(bwd_s, l.bwd_s);
      rank_lines.push_back(l);
    }
    if (rank != 0) {  // rank 0 checks against the oracle; the others wait for its verdict
      double pass = 0;  // the verdict is rank 0's contribution to a sum
      comm.all_reduce(comm::Rows{&pass, 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
      return pass > 0 ? 0 : 1;
    }
  } else
#endif
  {
    fwd_s = timed("forward", [&] { attn_forward(m.mask, fa, opts); });
    bwd_s = timed("backward", [&] { attn_backward(m.mask, ba, opts); });
  }

  std::mt19937_64 rng(f.mask.spec.seed + 0x5eed);
  const auto q_rows = pick_query_rows(nq, f.check_rows, rng);
  const auto k_rows = pick_key_rows(m.mask, f.check_rows / 4, kOracleKeyBudget / (hq * d), rng);
  oracle::RowResult ref;
  if (!q_rows.empty()) {
    timed("oracle on " + std::to_string(q_rows.size()) + " q and " + std::to_string(k_rows.size()) +
              " k rows",
          [&] { ref = oracle::sampled(m.mask, p, q_rows, k_rows); });
  }
  const auto error = [](const Buffer& b, const std::vector<std::int64_t>& rows,
                        std::int64_t row_len, const std::vector<double>& want) {
    if (rows.empty()) return std::optional<double>();
    return std::optional(
        oracle::rel_error(gather_rows(b, rows, row_len).data(), want.data(), want.size()));
  };
  Result r;
  r.fwd_s = fwd_s;
  r.bwd_s = bwd_s;
  r.fwd_flops = attn_fwd_flops(m.mask.area(), hq, d);
  r.errors = {{"out", error(g.out, ref.q_rows, hq * d, ref.out)},
              {"lse", error(g.lse, ref.q_rows, hq, ref.lse)},
              {"dq", error(g.dq, ref.q_rows, hq * d, ref.dq)},
              {"dk", error(g.dk, ref.k_rows, hkv * d, ref.dk)},
              {"dv", error(g.dv, ref.k_rows, hkv * d, ref.dv)}};
  r.bar = error_bar(dtype);
  r.num_q_checked = q_rows.size();
  r.num_k_checked = k_rows.size();
  for (const auto& [name, e] : r.errors) r.pass = r.pass && (!e || *e <= r.bar);  // NaN fails
  r.ranks = std::move(rank_lines);
#ifdef MAGI_CLI_MPI
  if (world) {
    double pass = r.pass ? 1 : 0;
    world->all_reduce(comm::Rows{&pass, 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  }
#endif
  if (f.json) {
    print_json(f, m, r);
  } else {
    print_table(f, m, r);
  }
  return r.pass ? 0 : 1;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = parent.add_subcommand(
      "run", "forward + backward on random inputs, timed and checked against the fp64 oracle");
  add_mask_flags(*cmd, flags->mask);
  cmd->add_option("--heads-q", flags->heads_q, "query heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--heads-kv", flags->heads_kv, "key/value heads (divides --heads-q)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", flags->head_dim, "head dimension")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", flags->dtype, "input dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}));
  cmd->add_option("--threads", flags->threads, "CPU threads (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--softcap", flags->softcap, "logit softcap c (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--sink", flags->sink, "learnable sink tokens per head")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--check-rows", flags->check_rows,
                  "query rows checked against the oracle; key rows: up to a quarter as many, "
                  "within the oracle's time budget (0: no check)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", flags->json, "print one JSON result line instead of the table");
  cmd->add_option("--ranks", flags->ranks,
                  "run distributed on this many MPI ranks: under mpirun, the ranks it started; "
                  "without it, magiattn starts them with mpiexec (0: as launched)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--comm-timeout", flags->comm_timeout_s,
                  "seconds a rank waits for a peer before failing (distributed runs)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return {cmd, [flags] { return run_attention(*flags); }};
}

}  // namespace magi::cli
