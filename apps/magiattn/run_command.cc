// `magiattn run`: one forward and one backward through the public API on seeded normal
// inputs, timed, then checked against the fp64 oracle on sampled rows. The oracle is scalar
// fp64 and must recompute every row that sees a checked key, so key rows are chosen within a
// budget: the default 16k-token check then takes seconds where a full one takes minutes.
// Nothing large is allocated or built before the memory it needs is checked (memory_estimate.h).
#include "run_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "checks.h"
#include "device_run.h"
#include "distributed.h"
#include "magi/attention.h"
#include "magi/error.h"
#include "mask_flags.h"
#include "memory_estimate.h"
#include "oracle.h"
#include "run_buffers.h"

#ifdef MAGI_CLI_MPI  // distributed `run` under mpirun: the runtime over the MPI communicator
#include "magi/plan.h"
#include "magi/runtime.h"
#include "mpi_communicator.h"
#endif

namespace magi::cli {
namespace {

bool g_quiet = false;  // ranks other than 0 print no progress

// fp64: docs/semantics.md §5's bar for the CPU backend. fp32, bf16, fp16: inputs are rounded to
// their dtype once and the oracle reads the same rounded values, while the CPU backend widens them
// and computes and stores in fp32, so only fp32 arithmetic is left and the fp32 bar applies.
double error_bar(DType t) { return t == DType::kF64 ? 1e-12 : 1e-5; }
// The GPU kernels round P (and dS) to the 16-bit input dtype before their matrix products, so
// their error is that of bf16/fp16 arithmetic: the bars of the GPU tests against an fp32/fp64
// reference, relative to the largest value (tests/python/test_gpu.py: out 2e-2;
// tests/python/dist_worker.py and torchrun_worker.py: out 2e-2, dq/dk/dv 3e-2).
constexpr double kGpuOutBar = 2e-2, kGpuGradBar = 3e-2;

// Multiply-adds (cells x heads x head dim) the oracle may spend recomputing rows for the dk/dv
// check: about 5 s of its fp64 scalar loops on 2 cores (4M cells at Hq 8, D 128).
constexpr std::int64_t kOracleKeyBudget = std::int64_t(1) << 32;

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

DType compute_dtype(DType in) { return in == DType::kF64 ? DType::kF64 : DType::kF32; }

// The mask's tokens before it is built: a family's from --seqlen, a file's from the file
// (loaded here: its size bounds it). `m` keeps a loaded file for later.
std::int64_t mask_tokens(const RunFlags& f, std::optional<NamedMask>& m) {
  if (f.mask.mask_file.empty()) return f.mask.spec.seqlen;
  if (!m) m = make_mask(f.mask);
  return m->mask.total_seqlen_q();
}

// What `processes` ranks of this host, each running this problem over cp ranks, allocate.
void require_run_memory(const RunFlags& f, std::optional<NamedMask>& m, int cp, int processes) {
  // On cuda the host still holds the inputs, their fp64 copies and the downloaded outputs, but
  // no CPU backend packs (device memory: require_device_memory).
  if (f.mask.no_memory_check) return;
  const DType dtype = dtype_from_name(f.dtype);
  const double tokens = double(mask_tokens(f, m));
  const double tokens_k = m ? double(m->mask.total_seqlen_k()) : tokens;
  RunSizes s;
  s.num_q = tokens, s.num_k = tokens_k;
  s.heads_q = double(f.heads_q), s.heads_kv = double(f.heads_kv), s.head_dim = double(f.head_dim);
  s.sink = double(f.sink), s.check_rows = double(f.check_rows), s.cp = cp;
  s.gpu = f.cuda;
  s.input_bytes = double(dtype_size(dtype));
  s.compute_bytes = double(dtype_size(compute_dtype(dtype)));
  MemoryEstimate e;
  e.processes = processes;
  add_run_tensors(e, s);
  e.add("mask", mask_bytes_estimate(f.mask));
  require_memory(e, "run",
                 f.mask.mask_file.empty()
                     ? "lower --seqlen, --heads-q, --heads-kv or --head-dim"
                     : "use a smaller mask file or lower --heads-q, --heads-kv or --head-dim");
}

// Checks that involve two flags; they fail on every rank alike.
void check_run_flags(const RunFlags& f) {
  MAGI_CHECK(f.heads_q % f.heads_kv == 0, "--heads-q ", f.heads_q,
             " is not a multiple of --heads-kv ", f.heads_kv);
}

// Everything allocated before the timed calls: the mask, the whole problem's tensors and the
// fp64 copies of the inputs that the oracle reads.
struct Setup {
  NamedMask m;
  DType dtype, compute;
  oracle::Problem p;
  AttnBuffers g;
  Buffer sink, dsink;
  AttnOptions opts;
  std::optional<TensorView> sink_v, dsink_v;

  Setup(const RunFlags& f, NamedMask mask)
      : m(std::move(mask)),
        dtype(dtype_from_name(f.dtype)),
        compute(compute_dtype(dtype)),
        g(dtype, compute, m.mask.total_seqlen_q(), m.mask.total_seqlen_k(), f.heads_q, f.heads_kv,
          f.head_dim),
        sink(compute, f.sink * f.heads_q),
        dsink(compute, f.sink * f.heads_q) {
    p.num_q = g.nq, p.num_k = g.nk, p.heads_q = g.hq, p.heads_kv = g.hkv, p.head_dim = g.d;
    p.softcap = f.softcap;
    p.sink_len = f.sink;
    timed("inputs", [&] {
      const std::uint64_t s = f.mask.spec.seed * 8;  // one stream per tensor
      p.q = fill_normal(g.q, s + 1), p.k = fill_normal(g.k, s + 2), p.v = fill_normal(g.v, s + 3);
      p.dout = fill_normal(g.dout, s + 4), p.sink = fill_normal(sink, s + 5);
    });
    opts.softcap = f.softcap;
    opts.num_threads = f.threads;
    if (f.sink > 0) sink_v = sink.view({f.sink, g.hq}), dsink_v = dsink.view({f.sink, g.hq});
  }
};

// `sharing`: processes on this process's GPU (cuda runs).
std::unique_ptr<Setup> set_up(const RunFlags& f, int cp, int processes, int sharing = 1) {
  std::optional<NamedMask> m;
  require_run_memory(f, m, cp, processes);
  if (!m) m = make_mask(f.mask);
  const std::int64_t nq = m->mask.total_seqlen_q(), nk = m->mask.total_seqlen_k();
  const std::int64_t local = (nq + cp - 1) / cp;  // at most one chunk more with --uneven
  if (cp == 1) {
    require_device_memory(f, nq, nk, nk, 1, sharing);
  } else {
    require_device_memory(f, local, local, nk, cp, sharing);
  }
  return std::make_unique<Setup>(f, std::move(*m));
}

// The oracle's verdict on sampled rows of the whole problem's outputs and gradients.
Result check(const RunFlags& f, Setup& s, double fwd_s, double bwd_s) {
  const Mask& mask = s.m.mask;
  const std::int64_t hq = f.heads_q, hkv = f.heads_kv, d = f.head_dim;
  std::mt19937_64 rng(f.mask.spec.seed + 0x5eed);
  const auto q_rows = pick_query_rows(mask.total_seqlen_q(), f.check_rows, rng);
  const auto k_rows = pick_key_rows(mask, f.check_rows / 4, kOracleKeyBudget / (hq * d), rng);
  oracle::RowResult ref;
  if (!q_rows.empty()) {
    timed("oracle on " + std::to_string(q_rows.size()) + " q and " + std::to_string(k_rows.size()) +
              " k rows",
          [&] { ref = oracle::sampled(mask, s.p, q_rows, k_rows); });
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
  r.fwd_flops = attn_fwd_flops(mask.area(), hq, d);
  r.errors = {{"out", error(s.g.out, ref.q_rows, hq * d, ref.out)},
              {"lse", error(s.g.lse, ref.q_rows, hq, ref.lse)},
              {"dq", error(s.g.dq, ref.q_rows, hq * d, ref.dq)},
              {"dk", error(s.g.dk, ref.k_rows, hkv * d, ref.dk)},
              {"dv", error(s.g.dv, ref.k_rows, hkv * d, ref.dv)}};
  r.bar = f.cuda ? kGpuOutBar : error_bar(s.dtype);
  r.grad_bar = f.cuda ? kGpuGradBar : r.bar;
  r.num_q_checked = q_rows.size();
  r.num_k_checked = k_rows.size();
  for (const auto& [name, e] : r.errors) {  // NaN fails
    const double bar = name == "out" || name == "lse" ? r.bar : r.grad_bar;
    r.pass = r.pass && (!e || *e <= bar);
  }
  return r;
}

int print_result(const RunFlags& f, const Setup& s, const Result& r) {
  if (f.json) {
    print_json(f, s.m, r);
  } else {
    print_table(f, s.m, r);
  }
  return r.pass ? 0 : 1;
}

// On the GPU: the inputs uploaded, one untimed call each way (it loads the kernels and builds
// the prepared mask's device work lists), then the timed steady-state calls (CUDA events), the
// outputs downloaded into the host buffers for the check.
int run_single_cuda(const RunFlags& f) {
  const std::unique_ptr<Setup> s = set_up(f, 1, 1);
  std::unique_ptr<DeviceBuffers> d;
  timed("upload to " + f.device_label, [&] {
    d = std::make_unique<DeviceBuffers>(s->g, f.sink > 0 ? &s->sink : nullptr, &s->dsink, f.gpu,
                                        true);
    d->synchronize();
  });
  const PreparedMask pm(s->m.mask);
  AttnOptions opts = s->opts;
  opts.cuda_stream = DeviceBuffers::kStream;
  const FwdArgs fa = d->fwd(true);
  const BwdArgs ba = d->bwd(true);
  timed("warm-up (kernel load, mask preparation)", [&] {
    attn_forward(pm, fa, opts);
    attn_backward(pm, ba, opts);
    d->synchronize();
  });
  double fwd_s = 0, bwd_s = 0;
  timed("forward", [&] { fwd_s = d->seconds([&] { attn_forward(pm, fa, opts); }); });
  timed("backward", [&] { bwd_s = d->seconds([&] { attn_backward(pm, ba, opts); }); });
  timed("download", [&] { d->download(); });
  return print_result(f, *s, check(f, *s, fwd_s, bwd_s));
}

int run_single(const RunFlags& f) {
  if (f.cuda) return run_single_cuda(f);
  const std::unique_ptr<Setup> s = set_up(f, 1, 1);
  const FwdArgs fa = s->g.fwd(s->sink_v);
  const BwdArgs ba = s->g.bwd(s->sink_v, s->dsink_v);
  const double fwd_s = timed("forward", [&] { attn_forward(s->m.mask, fa, s->opts); });
  const double bwd_s = timed("backward", [&] { attn_backward(s->m.mask, ba, s->opts); });
  return print_result(f, *s, check(f, *s, fwd_s, bwd_s));
}

#ifdef MAGI_CLI_MPI
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

std::string ranks_label(const RunFlags& f, int cp) {
  if (f.ranks > 0 && !f.ranks_given)
    return std::to_string(cp) + " ranks (one per GPU; see --ranks)";
  return f.ranks > 0 ? "--ranks " + std::to_string(cp) : std::to_string(cp) + " MPI ranks";
}

// What one rank runs on: its local tensors (host rows, or their device copies on cuda), the
// communicator that moves them, and on cuda the plan's masks prepared once.
struct RankTensors {
  FwdArgs la;
  BwdArgs lb;
  AttnOptions opts;
  std::uintptr_t stream = 0;
  DeviceBuffers* dev = nullptr;
  const runtime::PreparedRank* prepared = nullptr;
};

// Waits for this rank's GPU (cuda runs), so host clocks and barriers see finished work.
void sync_device(const RankTensors& t) {
  if (t.dev != nullptr) t.dev->synchronize();
}

// The timed distributed forward + backward of a set-up problem; rank 0 checks and prints.
// `world` (MPI, host rows) agrees on times and the verdict; `comm` moves the attention's rows.
int run_ranks(const RunFlags& f, comm::Communicator& world, comm::Communicator& comm, Setup& s,
              const plan::DistPlan& dp, const RankTensors& t) {
  const int rank = comm.rank(), cp = comm.size();
  const std::int64_t hkv = f.heads_kv, d = f.head_dim, ns = f.sink, hq = f.heads_q;
  const DType dtype = s.dtype, compute = s.compute;
  const FwdArgs fa = s.g.fwd(s.sink_v);
  const BwdArgs ba = s.g.bwd(s.sink_v, s.dsink_v);
  const FwdArgs& la = t.la;
  const BwdArgs& lb = t.lb;
  Buffer& dsink = s.dsink;
  double fwd_s = 0, bwd_s = 0;
  std::vector<Result::RankLine> rank_lines;
  timed("dispatch", [&] {
    runtime::dispatch(dp, comm, fa.q, la.q, t.stream);
    runtime::dispatch(dp, comm, fa.k, la.k, t.stream);
    runtime::dispatch(dp, comm, fa.v, la.v, t.stream);
    runtime::dispatch(dp, comm, ba.dout, lb.dout, t.stream);
    sync_device(t);
  });
  runtime::CalcStats fwd_stats, bwd_stats;
  if (t.dev != nullptr) {  // the first calls load the kernels and upload the prepared masks
    world.barrier();
    timed("warm-up (rank 0)", [&] {
      runtime::calc_attn_forward(dp, comm, la, t.opts, nullptr, t.prepared);
      runtime::calc_attn_backward(dp, comm, lb, t.opts, nullptr, t.prepared);
      sync_device(t);
    });
  }
  world.barrier();  // every rank starts the timed forward together
  const double my_fwd = timed("forward (rank 0)", [&] {
    runtime::calc_attn_forward(dp, comm, la, t.opts, &fwd_stats, t.prepared);
    sync_device(t);
  });
  world.barrier();
  const double my_bwd = timed("backward (rank 0)", [&] {
    runtime::calc_attn_backward(dp, comm, lb, t.opts, &bwd_stats, t.prepared);
    sync_device(t);
  });
  world.barrier();
  double fwd_comm = 0, bwd_comm = 0;
  timed("communication alone (fwd, bwd)", [&] {
    fwd_comm = runtime::comm_only_seconds(dp, comm, la.k, la.v, false);
    world.barrier();
    bwd_comm = runtime::comm_only_seconds(dp, comm, la.k, la.v, true);
  });
  if (ns > 0) {  // dsink is a per-rank partial: summed like a replicated parameter's gradient
    if (t.dev != nullptr) t.dev->download_dsink();
    world
        .all_reduce(comm::Rows{dsink.view({ns, hq}).data, 1, ns * hq, compute},
                    comm::ReduceOp::kSum)
        ->wait();
  }
  timed("undispatch", [&] {  // into the host's global rows, which the oracle checks
    runtime::undispatch(dp, comm, la.out, fa.out, t.stream);
    runtime::undispatch(dp, comm, la.lse, fa.lse, t.stream);
    runtime::undispatch(dp, comm, lb.dq, ba.dq, t.stream);
    runtime::undispatch(dp, comm, lb.dk, ba.dk, t.stream);
    runtime::undispatch(dp, comm, lb.dv, ba.dv, t.stream);
  });
  // Every rank's times to every rank; the table reports the slowest.
  // Through the Communicator, not raw MPI, so a dead rank gives an error, never a hang.
  constexpr int kTimes = 6;
  std::vector<double> times(std::size_t(kTimes * cp), 0.0);
  const double mine[kTimes] = {my_fwd,           my_bwd,   fwd_stats.wait_s,
                               bwd_stats.wait_s, fwd_comm, bwd_comm};
  std::copy(mine, mine + kTimes, times.begin() + kTimes * rank);
  world.all_reduce(comm::Rows{times.data(), 1, kTimes * cp, DType::kF64}, comm::ReduceOp::kSum)
      ->wait();
  const double row_bytes = double(2 * hkv * d * dtype_size(dtype));  // one K row + one V row
  for (int r = 0; r < cp; ++r) {
    const plan::RankPlan& rp = dp.ranks[std::size_t(r)];
    Result::RankLine l;
    l.tokens = dp.dispatch.rank_tokens(r);
    l.area = rp.host_area;
    for (const plan::Stage& st : rp.stages) l.area += st.area;
    const double* tm = times.data() + kTimes * r;
    l.fwd_s = tm[0], l.bwd_s = tm[1], l.fwd_wait_s = tm[2], l.bwd_wait_s = tm[3];
    l.fwd_comm_s = tm[4], l.bwd_comm_s = tm[5];
    const auto [in, out_rows] = cast_rows(rp);
    l.bytes_in = double(in) * row_bytes;
    l.bytes_out = double(out_rows) * row_bytes;
    fwd_s = std::max(fwd_s, l.fwd_s);
    bwd_s = std::max(bwd_s, l.bwd_s);
    rank_lines.push_back(l);
  }

  // Rank 0 checks against the oracle and sends the exit code (0 pass, 1 FAIL, 2 or 3 an
  // error it reports) as its share of a sum; the others end with it in silence.
  double verdict = 0;
  Result r;
  std::exception_ptr error;
  if (rank == 0) {
    try {
      r = check(f, s, fwd_s, bwd_s);
      verdict = r.pass ? 0 : 1;
    } catch (const std::exception& e) {
      verdict = exit_code_of(e);
      error = std::current_exception();
    }
  }
  world.all_reduce(comm::Rows{&verdict, 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  if (rank != 0) return int(verdict);
  if (error) std::rethrow_exception(error);
  r.ranks = std::move(rank_lines);
  return print_result(f, s, r);
}

// Ranks per GPU on this host (cuda runs): ranks beyond the GPU count share devices.
int ranks_per_gpu(const RunFlags& f, int local) {
  if (!f.cuda) return 1;
  const int gpus = std::max(1, visible_gpus());
  return (local + gpus - 1) / gpus;
}

// --comm auto decides per host (GPU count, libnccl): NCCL only where every rank chose it, so
// no rank waits in an NCCL bootstrap that another skipped. One small all-reduce over MPI.
std::string agree_on_comm(comm::Communicator& world, const std::string& mine) {
  double votes = mine == "nccl" ? 1 : 0;
  world.all_reduce(comm::Rows{&votes, 1, 1, DType::kF64}, comm::ReduceOp::kSum)->wait();
  return votes == double(world.size()) ? "nccl" : "mpi";
}

// Under mpirun, or with --ranks (then launched through mpiexec first). Setup failures are
// compared across ranks before the first transfer (distributed.h); a later failure is
// reported by each rank that sees it, prefixed with its rank beyond rank 0.
int run_distributed(RunFlags f) {
  std::optional<MpiSession> mpi_session;
  std::unique_ptr<comm::mpi::MpiCommunicator> world;
  std::unique_ptr<comm::Communicator> nccl;  // --comm nccl: destroyed before MPI's world
  struct SkipFinalizeIfBroken {              // destroyed before nccl, world and the session
    std::optional<MpiSession>& session;
    const std::unique_ptr<comm::mpi::MpiCommunicator>& world;
    const std::unique_ptr<comm::Communicator>& nccl;
    ~SkipFinalizeIfBroken() {
      if (session && ((world && world->broken()) || (nccl && nccl->broken())))
        session->comm_failed = true;
    }
  } skip_finalize_if_broken{mpi_session, world, nccl};
  mpi_session.emplace();
  world = std::make_unique<comm::mpi::MpiCommunicator>();
  world->set_timeout(std::chrono::milliseconds(std::int64_t(f.comm_timeout_s * 1000)));
  const int rank = world->rank(), cp = world->size();
  g_quiet = rank != 0;
  const std::string who = rank == 0 ? "" : "rank " + std::to_string(rank) + ": ";
  std::unique_ptr<Setup> s;
  plan::DistPlan dp;
  std::unique_ptr<AttnBuffers> l;
  std::unique_ptr<DeviceBuffers> dev;
  std::unique_ptr<runtime::PreparedRank> prepared;
  std::string comm_choice = "mpi";
  int code = 0;
  std::string text;
  std::exception_ptr error;
  try {
    MAGI_CHECK(f.ranks == 0 || f.ranks == cp, "--ranks ", f.ranks, ": running on ", cp,
               " MPI ranks");
    // Ranks share the host: split its cores unless --threads says otherwise.
    if (f.threads == 0) f.threads = std::max(1, int(std::thread::hardware_concurrency()) / cp);
    const int local = local_ranks(cp);
    choose_gpu(f, local_rank(rank));
    comm_choice = resolve_comm(f, local);
    s = set_up(f, cp, local_ranks(1), ranks_per_gpu(f, local));
    require_divisible(tokens_label(f.mask, s->g.nq), s->g.nq, ranks_label(f, cp), cp, 0, f.uneven);
    plan::PlanOptions po;
    po.dispatch.cp = cp;
    po.dispatch.uneven = f.uneven;
    timed("plan for " + std::to_string(cp) + " ranks",
          [&] { dp = plan::make_plan(s->m.mask, po); });
    const std::int64_t nl = dp.dispatch.rank_tokens(rank);
    l = std::make_unique<AttnBuffers>(s->dtype, s->compute, nl, nl, f.heads_q, f.heads_kv,
                                      f.head_dim);  // this rank's rows
    if (f.cuda) {
      dev = std::make_unique<DeviceBuffers>(*l, f.sink > 0 ? &s->sink : nullptr, &s->dsink, f.gpu,
                                            false);
      prepared = std::make_unique<runtime::PreparedRank>(dp, rank);
    }
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    text = error_text(e, false);
    error = std::current_exception();
  }
  try {
    const Verdict v = agree_on_setup(*world, code, text);
    if (!v.go_on) {
      if (v.print) std::rethrow_exception(error);
      return v.exit_code;
    }
    f.comm_used = agree_on_comm(*world, comm_choice);
#ifdef MAGI_CLI_NCCL
    if (f.comm_used == "nccl") {
      timed("NCCL communicator", [&] { nccl = make_nccl_world(*world, f.gpu, f.comm_timeout_s); });
    }
#endif
    RankTensors t;
    t.opts = s->opts;
    if (dev) {
      t.la = dev->fwd(false), t.lb = dev->bwd(false);
      t.stream = DeviceBuffers::kStream;
      t.opts.cuda_stream = DeviceBuffers::kStream;
      t.dev = dev.get();
      t.prepared = prepared.get();
    } else {
      t.la = l->fwd(s->sink_v), t.lb = l->bwd(s->sink_v, s->dsink_v);
    }
    return run_ranks(f, *world, nccl ? *nccl : *world, *s, dp, t);
  } catch (const std::exception& e) {
    return report_error(e, who);
  }
}
#endif

int run_attention(RunFlags f) {
  check_run_flags(f);
  resolve_device(f);
#ifdef MAGI_CLI_MPI
  const bool under_mpi = launched_by_mpi();
  // On cuda, one rank per visible GPU unless told otherwise (one GPU: one process).
  if (f.cuda && !f.ranks_given && !under_mpi && visible_gpus() > 1) f.ranks = visible_gpus();
  if (f.ranks > 1 && !under_mpi) {
    // Refuse here what every rank would refuse, before any rank starts.
    std::optional<NamedMask> m;
    require_run_memory(f, m, f.ranks, f.ranks);
    const std::int64_t tokens = mask_tokens(f, m);
    require_divisible(tokens_label(f.mask, tokens), tokens, ranks_label(f, f.ranks), f.ranks, 0,
                      f.uneven);
    resolve_comm(f, f.ranks);  // all ranks start on this host
    launch_ranks(f.ranks);
  }
  if (f.ranks > 0 || under_mpi) return run_distributed(f);
#else
  MAGI_CHECK(f.ranks == 0, "--ranks: this magiattn was built without MPI");
#endif
  choose_gpu(f, 0);
  return run_single(f);
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = parent.add_subcommand(
      "run", "forward + backward on random inputs, timed and checked against the fp64 oracle");
  add_mask_flags(*cmd, flags->mask);
  cmd->add_option("--heads-q", flags->heads_q, "query heads")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--heads-kv", flags->heads_kv, "key/value heads (divides --heads-q)")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--head-dim", flags->head_dim,
                  "head dimension: a multiple of 8 up to " + std::to_string(kMaxHeadDim))
      ->capture_default_str()
      ->check(in_range(8, kMaxHeadDim))
      ->check(multiple_of(8));
  CLI::Option* dtype = cmd->add_option("--dtype", flags->dtype,
                                       "input dtype (default: fp32 on the cpu, bf16 on cuda)")
                           ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}));
  cmd->add_option("--device", flags->device,
                  "where the attention runs: cuda needs this build's sm90 kernels for the dtype "
                  "and head dim and a visible Hopper GPU (auto: cuda when so, else cpu)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", flags->threads, "CPU threads (0: all)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--softcap", flags->softcap, "logit softcap c (0: off)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--sink", flags->sink, "learnable sink tokens per head")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--check-rows", flags->check_rows,
                  "query rows checked against the oracle; key rows: up to a quarter as many, "
                  "within the oracle's time budget (0: no check)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_flag("--json", flags->json, "print one JSON result line instead of the table");
  CLI::Option* ranks =
      cmd->add_option("--ranks", flags->ranks,
                      "run distributed on this many MPI ranks: under mpirun, the ranks it "
                      "started; without it, magiattn starts them with mpiexec (0: as launched; "
                      "default on cuda outside mpirun: one rank per visible GPU)")
          ->capture_default_str()
          ->check(at_least(0));
  cmd->add_option("--comm", flags->comm,
                  "distributed: what moves the ranks' rows (auto: nccl on cuda when this build "
                  "has it and every rank has its own GPU, else mpi, which stages GPU rows "
                  "through host memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  cmd->add_flag("--uneven", flags->uneven,
                "distributed: allow ranks to differ by one chunk when they do not divide the "
                "tokens");
  cmd->add_option("--comm-timeout", flags->comm_timeout_s,
                  "seconds a rank waits for a peer before failing (distributed runs)")
      ->capture_default_str()
      ->check(above(0));
  return {cmd, [flags, dtype, ranks] {
            flags->dtype_given = dtype->count() > 0;
            flags->ranks_given = ranks->count() > 0;
            return run_attention(*flags);
          }};
}

}  // namespace magi::cli
