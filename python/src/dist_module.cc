// magiattn._dist module: communicators (MPI, NCCL or both, whichever the build found) and
// plans. MPI is initialised on first use unless someone (mpi4py, the caller's C code) already
// did; we finalise only what we initialised. An MPI communicator comes from MPI_COMM_WORLD or
// from a Fortran handle (mpi4py's comm.py2f()), so mpi4py is never a build dependency. An NCCL
// communicator comes from a unique id that the caller hands to every rank (magiattn.dist does it
// through torch.distributed or mpi4py), so neither is a build dependency either. The key's plan
// is made here (make_plan, from the mask's ranges) and stays a C++ value; a saved plan arrives
// as its JSON text (Plan.from_json). The two modules share no C++ types.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

// <iostream>: see module.cc (the stream initialiser that a static libstdc++ needs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "arrays.h"
#include "dist.h"
#include "magi/error.h"
#include "magi/plan.h"
#include "mask_args.h"
#include "plan_options.h"

#ifdef MAGI_HAS_MPI
#include <mpi.h>

#include "mpi_check.h"
#include "mpi_communicator.h"
#endif
#ifdef MAGI_HAS_NCCL
#include "magi/nccl.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace magi::py::dist {
namespace {

#ifdef MAGI_HAS_MPI
constexpr bool kHasMpi = true;
#else
constexpr bool kHasMpi = false;
#endif
#ifdef MAGI_HAS_NCCL
constexpr bool kHasNccl = true;
#else
constexpr bool kHasNccl = false;
#endif
constexpr const char* kNoMpi =
    "magiattn._dist was built without MPI (install an MPI, e.g. apt install libopenmpi-dev, "
    "then reinstall magiattn)";
constexpr const char* kNoNccl =
    "magiattn._dist was built without NCCL (it needs a CUDA build of magiattn: nvcc at build "
    "time)";

std::set<Comm*>& live_comms() {
  static auto* s = new std::set<Comm*>;  // never destroyed: outlives every Comm
  return *s;
}

// Seconds from Python as the communicator's milliseconds (at least 1).
std::chrono::milliseconds timeout_ms(double seconds) {
  MAGI_CHECK(std::isfinite(seconds) && seconds > 0, "timeout: ", seconds,
             " s must be finite and > 0");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1e3)));
}

#ifdef MAGI_HAS_MPI
bool g_initialised_here = false;

// True when this call initialised MPI (the caller then owns finalising it).
bool init_mpi() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  MAGI_CHECK(!finalised, "MPI is already finalized in this process; start a new one");
  if (initialised) return false;
  int provided = 0;  // MULTIPLE, as mpi4py asks: the communicator's progress thread needs it
  MAGI_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  g_initialised_here = true;
  return true;
}

MPI_Comm from_handle(std::optional<long long> fortran_handle) {
  if (!fortran_handle) return MPI_COMM_WORLD;
  const MPI_Comm c = MPI_Comm_f2c(MPI_Fint(*fortran_handle));
  MAGI_CHECK(c != MPI_COMM_NULL, "cp group: Fortran handle ", *fortran_handle,
             " is MPI_COMM_NULL (is this rank in the group?)");
  return c;
}
#endif

void shutdown(bool finalize) {
  Comm::close_all();
#ifdef MAGI_HAS_MPI
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalize && g_initialised_here && !finalised) MPI_Finalize();
#else
  (void)finalize;
#endif
}

std::unique_ptr<comm::Communicator> mpi_comm(std::optional<long long> fortran_handle) {
#ifdef MAGI_HAS_MPI
  init_mpi();
  return std::make_unique<comm::mpi::MpiCommunicator>(from_handle(fortran_handle));
#else
  (void)fortran_handle;
  MAGI_CHECK(false, "an MPI communicator: ", kNoMpi);
  return nullptr;
#endif
}

// (available, why not): whether a communicator can be made (libnccl loads).
std::pair<bool, std::string> nccl_available() {
#ifdef MAGI_HAS_NCCL
  std::string why;
  const bool ok = comm::nccl::available(&why);
  return {ok, ok ? std::string() : why};
#else
  return {false, kNoNccl};
#endif
}

std::string nccl_version() {
#ifdef MAGI_HAS_NCCL
  return comm::nccl::library_version();
#else
  MAGI_CHECK(false, "nccl_version: ", kNoNccl);
  return {};
#endif
}

nb::bytes nccl_unique_id() {
#ifdef MAGI_HAS_NCCL
  const comm::nccl::UniqueId id = comm::nccl::make_unique_id();
  return nb::bytes(id.data(), id.size());
#else
  MAGI_CHECK(false, "nccl_unique_id: ", kNoNccl);
  return nb::bytes();
#endif
}

// The argument checks come first, so they answer the same with or without a GPU or libnccl
// (make_communicator checks the device against the GPUs it sees).
std::unique_ptr<Comm> nccl_comm(nb::bytes unique_id, int rank, int size, int device,
                                double timeout_seconds) {
  constexpr std::size_t kIdBytes = 128;  // comm::nccl::UniqueId, ncclUniqueId
  MAGI_CHECK(unique_id.size() == kIdBytes, "unique_id: ", unique_id.size(),
             " bytes, but an NCCL unique id has ", kIdBytes,
             " (nccl_unique_id() on one rank, handed to all)");
  MAGI_CHECK(size >= 1, "size: ", size, " ranks; needs at least 1");
  MAGI_CHECK(rank >= 0 && rank < size, "rank: ", rank, " is not in [0, ", size,
             ") (size ", size, ")");
  MAGI_CHECK(device >= 0, "device: ", device, " is not a CUDA device index (>= 0)");
  const std::chrono::milliseconds timeout = timeout_ms(timeout_seconds);
#ifdef MAGI_HAS_NCCL
  comm::nccl::UniqueId id;
  std::memcpy(id.data(), unique_id.data(), kIdBytes);
  std::unique_ptr<comm::Communicator> c;
  {
    nb::gil_scoped_release release;  // collective: waits for the other ranks
    c = comm::nccl::make_communicator(id, rank, size, device, timeout.count());
  }
  c->set_timeout(timeout);
  return std::make_unique<Comm>(std::move(c), "nccl");
#else
  (void)timeout;
  MAGI_CHECK(false, "Communicator.nccl: ", kNoNccl);
  return nullptr;
#endif
}

}  // namespace

Comm::Comm(std::unique_ptr<comm::Communicator> c, const char* backend)
    : c_(std::move(c)), backend_(backend) {
  live_comms().insert(this);
}
Comm::~Comm() { live_comms().erase(this); }

comm::Communicator& Comm::get(const char* op) {
  MAGI_CHECK(c_ != nullptr, op, ": the communicator is closed (at exit, or by close())");
  return *c_;
}

void Comm::close() { c_.reset(); }

void Comm::close_all() {
  for (Comm* c : live_comms()) c->close();
}

}  // namespace magi::py::dist

NB_MODULE(_dist, m) {
  using magi::py::dist::Comm;
  namespace d = magi::py::dist;
  m.doc() = "magiattn distributed runtime over MPI and / or NCCL (has_mpi(), has_nccl())";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const magi::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const magi::py::dist::CommFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.def("has_mpi", [] { return d::kHasMpi; }, "Whether this module was built with MPI");
  m.def("has_nccl", [] { return d::kHasNccl; }, "Whether this module was built with NCCL");
#ifdef MAGI_HAS_MPI
  m.def("init_mpi", &d::init_mpi,
        "Initialise MPI (THREAD_MULTIPLE) unless it already is; True if this call did");
#endif
  m.def("shutdown", &d::shutdown, "finalize"_a = true,
        "Close every communicator, then MPI_Finalize if asked and init_mpi initialised MPI");
  m.def("nccl_available", &d::nccl_available,
        "(True, '') when libnccl loads, else (False, why not)");
  m.def("nccl_version", &d::nccl_version, "The loaded libnccl's version, e.g. '2.28.3'");
  m.def("nccl_unique_id", &d::nccl_unique_id,
        "A new NCCL unique id (128 bytes): made on one rank, handed to all");

  nb::class_<Comm>(m, "Communicator")
      .def(
          "__init__",
          [](Comm* self, std::optional<long long> handle) {
            new (self) Comm(d::mpi_comm(handle), "mpi");
          },
          "fortran_handle"_a.none() = nb::none(),
          "MPI: duplicates MPI_COMM_WORLD (None) or the communicator of a Fortran handle "
          "(initialises MPI first, unless it already is)")
      .def_static("nccl", &d::nccl_comm, "unique_id"_a, "rank"_a, "size"_a, "device"_a,
                  "timeout_seconds"_a = 300.0,
                  "NCCL on CUDA device `device`: collective over the `size` ranks that pass "
                  "the same unique_id (nccl_unique_id() of one rank)")
      .def_prop_ro("backend", &Comm::backend, "\"mpi\" or \"nccl\"")
      .def_prop_ro("rank", [](Comm& c) { return c.get("rank").rank(); })
      .def_prop_ro("size", [](Comm& c) { return c.get("size").size(); })
      .def_prop_ro("broken", [](Comm& c) { return c.get("broken").broken(); })
      .def_prop_ro("closed", &Comm::closed)
      .def_prop_rw(
          "timeout", [](Comm& c) { return double(c.get("timeout").timeout().count()) / 1000.0; },
          [](Comm& c, double seconds) { c.get("timeout").set_timeout(d::timeout_ms(seconds)); },
          "Seconds any wait may block before it raises RuntimeError naming the missing ranks")
      .def("close", &Comm::close);

  nb::class_<magi::plan::DistPlan>(m, "Plan")
      .def_static(
          "from_json", [](const std::string& text) { return magi::plan::plan_from_json(text); },
          "text"_a)
      .def(
          "to_json", [](const magi::plan::DistPlan& p) { return p.to_json(); },
          "The planner's JSON text of the plan")
      .def_prop_ro("cp", [](const magi::plan::DistPlan& p) { return int(p.ranks.size()); })
      .def_prop_ro("total_seqlen",
                   [](const magi::plan::DistPlan& p) { return p.dispatch.total_seqlen; })
      .def(
          "rank_tokens",
          [](const magi::plan::DistPlan& p, int rank) {
            MAGI_CHECK(rank >= 0 && rank < int(p.ranks.size()), "rank ", rank,
                       " is not in a plan for cp ", p.ranks.size());
            return p.dispatch.rank_tokens(rank);
          },
          "rank"_a)
      .def(
          "position_ids",
          [](const magi::plan::DistPlan& p, int rank) {
            MAGI_CHECK(rank >= 0 && rank < int(p.ranks.size()), "rank ", rank,
                       " is not in a plan for cp ", p.ranks.size());
            std::vector<std::int64_t> ids = p.dispatch.position_ids(rank);
            const std::size_t n = ids.size();
            return magi::py::to_numpy(std::move(ids), {n});
          },
          "rank"_a, "Global token index of every local row of `rank` (int64 [local tokens])");
  // The key's plan made here, a C++ value from the mask's ranges to the runtime (no JSON text
  // between the modules; plan_options.h is the one reading of the options).
  m.def(
      "make_plan",
      [](std::int64_t total_seqlen_q, std::int64_t total_seqlen_k, nb::handle q_ranges,
         nb::handle k_ranges, nb::handle attn_type_map, int cp, int num_stages,
         std::int64_t chunk_size, const std::string& algorithm, bool uneven) {
        const magi::Mask mask = magi::py::make_mask(total_seqlen_q, total_seqlen_k, q_ranges, k_ranges,
                                              attn_type_map);
        const magi::plan::PlanOptions opts =
            magi::py::plan_options(cp, num_stages, chunk_size, algorithm, uneven);
        nb::gil_scoped_release release;
        return magi::plan::make_plan(mask, opts);
      },
      "total_seqlen_q"_a, "total_seqlen_k"_a, "q_ranges"_a, "k_ranges"_a, "attn_type_map"_a,
      "cp"_a, "num_stages"_a, "chunk_size"_a, "algorithm"_a, "uneven"_a,
      "The plan of the mask (its ranges and types, as Mask takes them) over `cp` ranks");
  magi::py::dist::bind_runtime(m);
}
